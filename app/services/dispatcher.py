"""One webhook delivery over HTTP: build the signed request, POST it, classify the outcome.

The POST goes through app/services/webhook_http.py, cronhook's own HTTP/1.1 client (it says
why not aiohttp). Redirects are never followed (a 3xx is a failed attempt), every request has
a total deadline, and at most 64 KB of a response is read. The egress policy is enforced on
the addresses actually connected to (app/services/egress_resolver.py); a refused delivery is
not retried, and neither its error nor that of a failed connection says anything about the
address or port.

The last trust check (`deliver`'s `may_send`) runs after a connection is in hand (new or
pooled) and immediately before the request is written: no await lies between the check and
the write, so a scheduler that stalled anywhere before it (a slow connect, a paused process)
sends nothing once it has lost its lease or partition. The connection goes back to the pool
unused.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from collections.abc import Callable

from app.domain.egress import EgressPolicy
from app.domain.job import AttemptOutcome, ClaimedJob, RunOutcome
from app.domain.payload import storable_text
from app.domain.retry import is_retryable_status, parse_retry_after
from app.domain.signing import sign
from app.services.egress_resolver import EGRESS_DENIED, EgressDenied, EgressResolver, literal_host_denied
from app.services.webhook_http import (
    BadResponse,
    ConnectFailed,
    Origin,
    PostNotStarted,
    ServerClosed,
    WebhookHttp,
)

__all__ = ["Dispatcher", "PostNotStarted", "build_request", "webhook_id"]

# How much of a failing response's body is kept as the run's error.
ERROR_EXCERPT_CHARS = 512
USER_AGENT = "cronhook/0.1"
# Distinct target hosts whose egress verdict is remembered (then the memory starts over).
_LITERAL_CACHE_SIZE = 10_000
_FIXED_HEADERS = f"content-type: application/json\r\nuser-agent: {USER_AGENT}\r\n"


def webhook_id(job: ClaimedJob) -> str:
    """Stable for one occurrence across its retries, distinct between occurrences."""
    return f"msg_{job.occurrence_id.hex}"


def build_request(job: ClaimedJob, attempt_time: dt.datetime, completion_url: str | None = None) -> tuple[bytes, bytes]:
    """The attempt's body and header lines (all but Host and Content-Length), as sent.

    An async delivery carries its completion URL, signed as the body is (the same secrets,
    webhook-id and timestamp, the URL in place of the body), so a receiver can check that the
    URL came from cronhook before it reports there."""
    # The stored JSON text (PostgreSQL's jsonb output), signed and sent as it is.
    body = job.payload_json.encode()
    msg_id = webhook_id(job)
    timestamp = int(attempt_time.timestamp())
    # Space-separated signatures (Standard Webhooks): the previous secret's too while a
    # rotation's grace period lasts, so receivers switch without dropping deliveries.
    signature = sign(job.signing_secret, msg_id, timestamp, body)
    if job.previous_signing_secret is not None:
        signature += " " + sign(job.previous_signing_secret, msg_id, timestamp, body)
    scheduled_for = _utc_text(job.scheduled_for)
    # The occurrence's fire time: its nominal time (scheduled-for), or its jitter after.
    jittered_at = job.fire_at
    fires = scheduled_for if jittered_at is None else _utc_text(jittered_at)
    head = (
        f"{_target_header_lines(job.headers)}{_FIXED_HEADERS}webhook-id: {msg_id}\r\n"
        f"webhook-timestamp: {timestamp}\r\nwebhook-signature: {signature}\r\n"
        f"cronhook-job-id: {job.id}\r\ncronhook-attempt: {job.attempt}\r\n"
        f"cronhook-scheduled-for: {scheduled_for}\r\ncronhook-fire-at: {fires}\r\n"
    )
    if job.cause_id is not None:
        # A chained job's occurrence names the parent occurrence it runs after (its webhook-id).
        head += f"cronhook-cause-id: msg_{job.cause_id.hex}\r\n"
    if completion_url is not None:
        url_bytes = completion_url.encode()
        url_signature = sign(job.signing_secret, msg_id, timestamp, url_bytes)
        if job.previous_signing_secret is not None:
            url_signature += " " + sign(job.previous_signing_secret, msg_id, timestamp, url_bytes)
        deadline_s = job.completion.async_timeout_s
        head += (
            f"cronhook-completion-url: {completion_url}\r\ncronhook-completion-signature: {url_signature}\r\n"
            f"cronhook-completion-timeout: {deadline_s}\r\n"
        )
        if job.completion.heartbeat_timeout_s is not None:
            head += f"cronhook-heartbeat-timeout: {job.completion.heartbeat_timeout_s}\r\n"
    return body, head.encode("latin-1")


def _utc_text(at: dt.datetime) -> str:
    return at.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def _target_header_lines(headers: dict[str, str]) -> str:
    """The target's own headers as header lines. `Expect` is refused on targets (every attempt
    would wait out its timeout): rows from before that rule are sent without it. A line break
    or NUL, which would let a value start a header or a request of its own, is refused (the
    API refuses them already)."""
    if not headers:
        return ""
    lines = []
    for name, value in headers.items():
        if any(c in name or c in value for c in "\r\n\x00"):
            raise ValueError("a target header holds a line break")
        if name.lower() != "expect":
            lines.append(f"{name}: {value}\r\n")
    return "".join(lines)


class Dispatcher:
    def __init__(self, concurrency: int, max_timeout_s: float, egress: EgressPolicy | None = None) -> None:
        self._concurrency = concurrency
        self._max_timeout_s = max_timeout_s
        self._egress = egress or EgressPolicy()
        self._http: WebhookHttp | None = None
        # Host -> refused as an IP literal: the policy is fixed, and a target is sent to many
        # times (the URL itself is parsed once, by the client: WebhookHttp.origin).
        self._literal_refusals: dict[str, bool] = {}

    def _refused_literal(self, host: str) -> bool:
        refused = self._literal_refusals.get(host)
        if refused is None:
            if len(self._literal_refusals) >= _LITERAL_CACHE_SIZE:
                self._literal_refusals.clear()
            refused = self._literal_refusals[host] = literal_host_denied(self._egress, host)
        return refused

    async def start(self) -> None:
        if self._http is None:
            # Idle keep-alive connections: at most one per delivery slot.
            self._http = WebhookHttp(EgressResolver(self._egress), max_idle=self._concurrency)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def deliver(
        self,
        job: ClaimedJob,
        started_wall: dt.datetime,
        may_send: Callable[[], bool] | None = None,
        completion_url: str | None = None,
    ) -> AttemptOutcome:
        """`started_wall` is the attempt's start on the database clock (signed timestamp);
        `completion_url`, an async delivery's (sent as a header).

        Raises PostNotStarted when `may_send` says no just before the request is written."""
        assert self._http is not None, "Dispatcher.start() not called"
        timeout_s = min(job.timeout_s, self._max_timeout_s)
        started = time.monotonic()
        try:
            origin: Origin = self._http.origin(job.url)
            # The resolver sees names only: an IP literal is judged by the policy here.
            if self._refused_literal(origin.host):
                return _denied(started, started_wall)
            body, head = build_request(job, started_wall, completion_url)
            response = await self._http.post(origin, head, body, timeout_s, may_send)
        except TimeoutError:
            return _outcome(RunOutcome.TIMEOUT, None, f"no response within {timeout_s:g}s", started, started_wall)
        except EgressDenied:
            return _denied(started, started_wall)
        except (ConnectFailed, ServerClosed, BadResponse, OSError, ValueError) as exc:
            return _outcome(RunOutcome.CONNECTION_ERROR, None, _describe(exc), started, started_wall)
        status = response.status
        if 200 <= status < 300:
            return _outcome(RunOutcome.SUCCESS, status, None, started, started_wall)
        retryable = is_retryable_status(status, job.retry_on_status)
        error = f"HTTP {status}" + ("" if retryable else " (not retryable)")
        if response.body:
            error += ": " + response.body.decode("utf-8", "replace")[:ERROR_EXCERPT_CHARS]
        outcome = _outcome(RunOutcome.HTTP_ERROR, status, error, started, started_wall)
        answered_at = started_wall + dt.timedelta(milliseconds=outcome.duration_ms or 0)
        return dataclasses.replace(
            outcome, retryable=retryable, retry_after_s=parse_retry_after(response.retry_after, answered_at)
        )


def _outcome(
    outcome: RunOutcome, status: int | None, error: str | None, started: float, started_wall: dt.datetime
) -> AttemptOutcome:
    duration_ms = int((time.monotonic() - started) * 1000)
    # A receiver controls its response body, which the error quotes.
    stored = None if error is None else storable_text(error, ERROR_EXCERPT_CHARS)
    return AttemptOutcome(outcome, status, stored, duration_ms, started_wall)


def _denied(started: float, started_wall: dt.datetime) -> AttemptOutcome:
    outcome = _outcome(RunOutcome.CONNECTION_ERROR, None, EGRESS_DENIED, started, started_wall)
    # Retrying cannot help: the address stays refused until the operator allows it.
    return dataclasses.replace(outcome, retryable=False)


_CONNECT_FAILURES = {
    "dns": "connection failed: host name not resolved",
    "certificate": "connection failed: TLS certificate rejected",
    "tls": "connection failed: TLS handshake failed",
    "refused": "connection failed: refused",
    "reset": "connection failed: reset",
}


def _describe(exc: BaseException) -> str:
    """A coarse class only: addresses, ports and the C library's wording would let a tenant
    tell closed, filtered and TLS ports apart (a port scanner)."""
    if isinstance(exc, ConnectFailed):
        return _CONNECT_FAILURES.get(exc.kind, "connection failed")
    if isinstance(exc, ServerClosed):
        return "connection failed: the server closed the connection"
    if isinstance(exc, ValueError):
        return "connection failed: invalid URL"
    if isinstance(exc, ConnectionResetError):
        return "connection failed: reset"
    return "connection failed"
