"""One webhook delivery over HTTP: build the signed request, POST it, classify the outcome.

aiohttp, because the HTTP client must not be the bottleneck (see bench/). Redirects are
never followed (a 3xx is a failed attempt), every request has a total deadline, and at most
64 KB of a response is read. The egress policy is enforced on the addresses actually connected
to (app/services/egress_resolver.py); a refused delivery is not retried, and neither its error
nor that of a failed connection says anything about the address or port.

The last trust check (`deliver`'s `may_send`) runs in the connector, after a connection is
acquired (new or pooled) and immediately before aiohttp writes the request: no await lies
between the check and the write, so a scheduler that stalled anywhere before it (a wait for
a pooled connection, a slow connect, a paused process) sends nothing once it has lost its
lease or partition. The connection goes back to the pool unused.
"""

from __future__ import annotations

import contextvars
import dataclasses
import datetime as dt
import time
from collections.abc import Callable
from typing import Any

import aiohttp
from yarl import URL

from app.domain.egress import EgressPolicy
from app.domain.job import AttemptOutcome, ClaimedJob, RunOutcome
from app.domain.retry import is_retryable_status, parse_retry_after
from app.domain.signing import sign
from app.services.egress_resolver import EGRESS_DENIED, EgressDenied, EgressResolver, literal_host_denied

MAX_RESPONSE_BYTES = 64 * 1024
# How much of a failing response's body is kept as the run's error.
ERROR_EXCERPT_CHARS = 512
USER_AGENT = "cronhook/0.1"
# Distinct target URLs whose egress verdict is remembered (then the memory starts over).
_LITERAL_CACHE_SIZE = 10_000


class PostNotStarted(Exception):
    """The last trust check failed: nothing was written to the network."""


# The delivery's last trust check, read by the connector in the delivering task's context.
_may_send: contextvars.ContextVar[Callable[[], bool] | None] = contextvars.ContextVar("may_send", default=None)


class TrustCheckingConnector(aiohttp.TCPConnector):
    """A TCPConnector that asks the delivery whether it may still send, once the connection
    is in hand: aiohttp writes the request right after connect() returns."""

    async def connect(self, req: Any, traces: Any, timeout: Any) -> Any:  # noqa: ASYNC109 (aiohttp signature)
        conn = await super().connect(req, traces, timeout)
        may_send = _may_send.get()
        if may_send is not None and not may_send():
            conn.release()
            raise PostNotStarted
        return conn


def webhook_id(job: ClaimedJob) -> str:
    """Stable for one occurrence across its retries, distinct between occurrences."""
    return f"msg_{job.occurrence_id.hex}"


def build_request(job: ClaimedJob, attempt_time: dt.datetime) -> tuple[bytes, dict[str, str]]:
    # The stored JSON text (PostgreSQL's jsonb output), signed and sent as it is.
    body = job.payload_json.encode()
    msg_id = webhook_id(job)
    timestamp = int(attempt_time.timestamp())
    # `Expect` is refused on targets (every attempt would wait out its timeout); rows from
    # before that rule are sent without it.
    headers = {name: value for name, value in job.headers.items() if name.lower() != "expect"}
    headers.update(
        {
            "content-type": "application/json",
            "user-agent": USER_AGENT,
            "webhook-id": msg_id,
            "webhook-timestamp": str(timestamp),
            # Space-separated signatures (Standard Webhooks): the previous secret's too while
            # a rotation's grace period lasts, so receivers switch without dropping deliveries.
            "webhook-signature": " ".join(
                sign(secret, msg_id, timestamp, body)
                for secret in (job.signing_secret, job.previous_signing_secret)
                if secret is not None
            ),
            "cronhook-job-id": str(job.id),
            "cronhook-attempt": str(job.attempt),
            "cronhook-scheduled-for": job.scheduled_for.astimezone(dt.UTC).isoformat().replace("+00:00", "Z"),
        }
    )
    return body, headers


class Dispatcher:
    def __init__(self, concurrency: int, max_timeout_s: float, egress: EgressPolicy | None = None) -> None:
        self._concurrency = concurrency
        self._max_timeout_s = max_timeout_s
        self._egress = egress or EgressPolicy()
        self._session: aiohttp.ClientSession | None = None
        # URL -> refused as an IP literal: the policy is fixed, and a target's URL is sent
        # many times (parsing it for every delivery cost 2% of the scheduler's CPU).
        self._literal_refusals: dict[str, bool] = {}

    def _refused_literal(self, url: str) -> bool:
        refused = self._literal_refusals.get(url)
        if refused is None:
            if len(self._literal_refusals) >= _LITERAL_CACHE_SIZE:
                self._literal_refusals.clear()
            refused = self._literal_refusals[url] = _literal_denied(self._egress, url)
        return refused

    async def start(self) -> None:
        resolver = EgressResolver(self._egress)
        connector = TrustCheckingConnector(
            limit=self._concurrency,
            limit_per_host=0,
            # Cached answers are the vetted ones: a rebinding DNS server gains nothing.
            ttl_dns_cache=60,
            resolver=resolver,
            socket_factory=resolver.socket_factory,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            # Never send cookies one receiver set to another.
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,
            # No HTTP(S)_PROXY / NO_PROXY / .netrc from the environment: a proxy would make
            # the connection the egress policy checks the proxy's, not the target's.
            trust_env=False,
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def deliver(
        self, job: ClaimedJob, started_wall: dt.datetime, may_send: Callable[[], bool] | None = None
    ) -> AttemptOutcome:
        """`started_wall` is the attempt's start on the database clock (signed timestamp).

        Raises PostNotStarted when `may_send` says no just before the request is written."""
        assert self._session is not None, "Dispatcher.start() not called"
        _may_send.set(may_send)
        body, headers = build_request(job, started_wall)
        timeout_s = min(job.timeout_s, self._max_timeout_s)
        started = time.monotonic()
        if self._refused_literal(job.url):
            return _denied(started, started_wall)
        try:
            async with self._session.post(
                job.url,
                data=body,
                headers=headers,
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as response:
                excerpt = await _read_capped(response)
                status = response.status
                retry_after_header = response.headers.get("Retry-After")
        except TimeoutError:
            return _outcome(RunOutcome.TIMEOUT, None, f"no response within {timeout_s:g}s", started, started_wall)
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            # ValueError and bare OSError: bad URLs and socket errors that aiohttp does not wrap.
            if _is_egress_denied(exc):
                return _denied(started, started_wall)
            return _outcome(RunOutcome.CONNECTION_ERROR, None, _describe(exc), started, started_wall)
        if 200 <= status < 300:
            return _outcome(RunOutcome.SUCCESS, status, None, started, started_wall)
        retryable = is_retryable_status(status, job.retry_on_status)
        error = f"HTTP {status}" + ("" if retryable else " (not retryable)")
        if excerpt:
            error += ": " + excerpt.decode("utf-8", "replace")[:ERROR_EXCERPT_CHARS]
        outcome = _outcome(RunOutcome.HTTP_ERROR, status, error, started, started_wall)
        answered_at = started_wall + dt.timedelta(milliseconds=outcome.duration_ms or 0)
        return dataclasses.replace(
            outcome, retryable=retryable, retry_after_s=parse_retry_after(retry_after_header, answered_at)
        )


async def _read_capped(response: aiohttp.ClientResponse) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size < MAX_RESPONSE_BYTES:
        chunk = await response.content.read(MAX_RESPONSE_BYTES - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    if size >= MAX_RESPONSE_BYTES:
        # Do not drain an oversized body into a pooled connection: drop the connection.
        response.close()
    return b"".join(chunks)


def _outcome(
    outcome: RunOutcome, status: int | None, error: str | None, started: float, started_wall: dt.datetime
) -> AttemptOutcome:
    duration_ms = int((time.monotonic() - started) * 1000)
    return AttemptOutcome(outcome, status, _storable(error), duration_ms, started_wall)


def _storable(text: str | None) -> str | None:
    """A receiver controls its response body: make it safe for a PostgreSQL text column."""
    if text is None:
        return None
    cleaned = text.replace("\x00", "").encode("utf-8", "replace").decode("utf-8")
    return cleaned[:ERROR_EXCERPT_CHARS]


def _literal_denied(policy: EgressPolicy, url: str) -> bool:
    try:
        host = URL(url).raw_host
    except ValueError:
        return False  # aiohttp refuses it too: a connection error
    return host is not None and literal_host_denied(policy, host)


def _denied(started: float, started_wall: dt.datetime) -> AttemptOutcome:
    outcome = _outcome(RunOutcome.CONNECTION_ERROR, None, EGRESS_DENIED, started, started_wall)
    # Retrying cannot help: the address stays refused until the operator allows it.
    return dataclasses.replace(outcome, retryable=False)


def _is_egress_denied(exc: BaseException | None) -> bool:
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, EgressDenied):
            return True
        os_error = getattr(exc, "os_error", None)
        if isinstance(os_error, EgressDenied):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def _describe(exc: BaseException) -> str:
    """A coarse class only: addresses, ports and the C library's wording would let a tenant
    tell closed, filtered and TLS ports apart (a port scanner)."""
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return "connection failed: host name not resolved"
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return "connection failed: TLS certificate rejected"
    if isinstance(exc, aiohttp.ClientSSLError):
        return "connection failed: TLS handshake failed"
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        return "connection failed: the server closed the connection"
    if isinstance(exc, aiohttp.InvalidURL | ValueError):
        return "connection failed: invalid URL"
    os_error = getattr(exc, "os_error", exc)
    if isinstance(os_error, ConnectionRefusedError):
        return "connection failed: refused"
    if isinstance(os_error, ConnectionResetError):
        return "connection failed: reset"
    return "connection failed"
