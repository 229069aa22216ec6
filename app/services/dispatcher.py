"""One webhook delivery over HTTP: build the signed request, POST it, classify the outcome.

aiohttp, because the HTTP client must not be the bottleneck (see bench/). Redirects are
never followed (a 3xx is a failed attempt), every request has a total deadline, and at most
64 KB of a response is read.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import time

import aiohttp

from app.domain.job import AttemptOutcome, ClaimedJob, RunOutcome
from app.domain.retry import is_retryable_status, parse_retry_after
from app.domain.signing import sign

MAX_RESPONSE_BYTES = 64 * 1024
# How much of a failing response's body is kept as the run's error.
ERROR_EXCERPT_CHARS = 512
USER_AGENT = "cronhook/0.1"


def webhook_id(job: ClaimedJob) -> str:
    """Stable for one occurrence across its retries, distinct between occurrences."""
    return f"msg_{job.occurrence_id.hex}"


def build_request(job: ClaimedJob, attempt_time: dt.datetime) -> tuple[bytes, dict[str, str]]:
    body = json.dumps(job.payload, separators=(",", ":")).encode()
    msg_id = webhook_id(job)
    timestamp = int(attempt_time.timestamp())
    headers = dict(job.headers)
    headers.update(
        {
            "content-type": "application/json",
            "user-agent": USER_AGENT,
            "webhook-id": msg_id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": sign(job.signing_secret, msg_id, timestamp, body),
            "cronhook-job-id": str(job.id),
            "cronhook-attempt": str(job.attempt),
            "cronhook-scheduled-for": job.scheduled_for.astimezone(dt.UTC).isoformat().replace("+00:00", "Z"),
        }
    )
    return body, headers


class Dispatcher:
    def __init__(self, concurrency: int, max_timeout_s: float) -> None:
        self._concurrency = concurrency
        self._max_timeout_s = max_timeout_s
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=self._concurrency, limit_per_host=0, ttl_dns_cache=60)
        self._session = aiohttp.ClientSession(
            connector=connector,
            # Never send cookies one receiver set to another.
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def deliver(self, job: ClaimedJob, started_wall: dt.datetime) -> AttemptOutcome:
        """`started_wall` is the attempt's start on the database clock (signed timestamp)."""
        assert self._session is not None, "Dispatcher.start() not called"
        body, headers = build_request(job, started_wall)
        timeout_s = min(job.timeout_s, self._max_timeout_s)
        started = time.monotonic()
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
        except aiohttp.ClientError as exc:
            return _outcome(RunOutcome.CONNECTION_ERROR, None, _describe(exc), started, started_wall)
        except (OSError, ValueError) as exc:
            # Bad URLs and low-level socket errors that aiohttp does not wrap.
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


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:ERROR_EXCERPT_CHARS]
