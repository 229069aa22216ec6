"""POST /v1/completions/{token}[/heartbeat]: a receiver's reports on an asynchronous attempt
(app/domain/completion.py). HTTP only; the writes are app/store/completions.py.

No API key: the token in the path is the capability (minted per attempt, authenticated by
the key ring's MAC). A token cronhook did not mint is a 404 and counts as a failed
authentication of the client's address (too many: 429); each token may report
CRONHOOK_COMPLETION_REPORTS_PER_MIN times a minute. A report for an attempt that has ended
otherwise (rescued, retried, timed out, cancelled) is a 410 and is recorded on its run as
`fenced_at`; a second report for an attempt its receiver finished is a 409.
"""

from __future__ import annotations

import random
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request, Response

from app import metrics
from app.api.deps import AutocommitConn, KeyRingDep, QuotasDep, client_address, in_transaction, too_many
from app.api.errors import Problem
from app.api.schemas.completions import CompletionReport, HeartbeatReport
from app.db.async_engine import AsyncConnection
from app.domain.completion import MAX_RESULT_BYTES, CompletionToken, ReportOutcome, read_token
from app.domain.job import AttemptOutcome, FinishedAttempt, RunOutcome
from app.domain.lifecycle import after_attempt
from app.domain.payload import payload_json, payload_size
from app.store.completions import (
    OpenAttempt,
    job_apply_requested_pauses,
    job_attempt_open,
    job_heartbeat,
    job_read_open_attempt,
    run_fence_report,
)
from app.store.outcomes import finish_is_one_statement, job_finish_attempts

router = APIRouter(prefix="/v1/completions", tags=["completions"])

# Retry backoff jitter for reported retries (as the scheduler's, not a secret).
_rng = random.Random()

TokenPath = Annotated[
    str,
    Path(
        max_length=200,
        description="The token of the request's `cronhook-completion-url` (the URL's last segment)",
    ),
]


async def _admitted(request: Request, quotas: QuotasDep, key_ring: KeyRingDep, token: TokenPath) -> CompletionToken:
    """The attempt the token names, once its address and the token may report again."""
    address = client_address(request.scope)
    if (wait_s := quotas.auth_wait(address)) is not None:
        raise too_many("too many unknown completion tokens from this address", wait_s, "report-throttled")
    named = read_token(key_ring.mac_keys, token)
    if named is None:
        quotas.auth_failed(address)
        raise Problem(404, "unknown completion token", slug="not-found")
    if (wait_s := quotas.report_wait(named.digest)) is not None:
        raise too_many("too many reports with this completion token", wait_s, "report-throttled")
    return named


Admitted = Annotated[CompletionToken, Depends(_admitted)]

_DOC: dict[int | str, dict[str, Any]] = {204: {"description": "Recorded"}}


async def _ended(conn: AsyncConnection, token: CompletionToken) -> Problem:
    """The answer to a report for an attempt that is no longer open (its run marked fenced,
    committed before the error answer rolls the request's transaction back)."""
    ended = await run_fence_report(conn, token.job_id, token.lease_token)
    await conn.commit()
    if ended is not None and ended.finished_by_receiver:
        return Problem(
            409,
            f"this attempt is already finished (outcome {ended.outcome})",
            slug="attempt-finished",
            extra={"outcome": ended.outcome},
        )
    outcome = "" if ended is None else f" ({ended.outcome})"
    return Problem(
        410,
        f"this attempt has ended{outcome}: the job moved on; a retry is sent with a new token",
        slug="attempt-fenced",
        extra={"outcome": None if ended is None else ended.outcome},
    )


@router.post("/{token}/heartbeat", status_code=204, operation_id="reportHeartbeat", responses=_DOC)
async def report_heartbeat(token: Admitted, body: HeartbeatReport, conn: AutocommitConn) -> Response:
    """The attempt is still being worked on: pushes its heartbeat deadline out by the
    heartbeat timeout (never past its async_timeout_s deadline), with optional progress."""
    # One statement, atomic on its own (autocommit): no BEGIN and COMMIT round trips.
    if not await job_heartbeat(conn, token.job_id, token.lease_token, token.digest, body.progress, body.message):
        if await job_attempt_open(conn, token.job_id, token.lease_token):
            # Open, but under another token than this one (the one its 202 recorded).
            raise Problem(404, "unknown completion token", slug="not-found")
        raise await _ended(conn, token)
    return Response(status_code=204)


@router.post("/{token}", status_code=204, operation_id="reportCompletion", responses=_DOC)
async def report_completion(
    token: Admitted, body: CompletionReport, conn: AutocommitConn, key_ring: KeyRingDep
) -> Response:
    """The attempt's outcome: `succeeded`, `failed` (no retry) or `retry` (under the job's
    retry policy, after at least `retry_after_s`). The result is kept on the run."""
    result_json = None
    if "result" in body.model_fields_set and body.result is not None:
        result_json = payload_json(body.result)
        if (size := payload_size(result_json)) > MAX_RESULT_BYTES:
            raise Problem(
                413, f"result is {size} bytes; the limit is {MAX_RESULT_BYTES}", slug="too-large", field="result"
            )
    # Usually two statements in autocommit: the attempt read, then the finish, which is
    # guarded by the lease (a report that lost a race to a timeout, a cancel or another
    # report matches nothing and is answered as for an ended attempt). A finish that writes
    # more (a dead letter, skipped fire times, a pending pause) takes a transaction and the
    # row's lock.
    item: FinishedAttempt | None = None
    attempt = await job_read_open_attempt(conn, key_ring, token.job_id, token.lease_token, lock=False)
    if attempt is not None:
        item = _finished(attempt, token, body)
        if attempt.pause_requested or not finish_is_one_statement([item]):
            await in_transaction(conn)
            attempt = await job_read_open_attempt(conn, key_ring, token.job_id, token.lease_token, lock=True)
            item = None if attempt is None else _finished(attempt, token, body)
    if attempt is None or item is None:
        raise await _ended(conn, token)
    if item.lease not in await job_finish_attempts(conn, [item], results=[result_json]):
        raise await _ended(conn, token)
    if attempt.pause_requested:
        await job_apply_requested_pauses(conn, [attempt.job.id])
    await conn.commit()
    duration_ms = item.result.duration_ms
    metrics.async_report(body.outcome.value, None if duration_ms is None else duration_ms / 1000)
    return Response(status_code=204)


def _finished(attempt: OpenAttempt, token: CompletionToken, body: CompletionReport) -> FinishedAttempt:
    """The attempt as its receiver reported it, and the step it leads to."""
    if attempt.token_hash is not None and attempt.token_hash != token.digest:
        raise Problem(404, "unknown completion token", slug="not-found")
    job, started = attempt.job, attempt.awaiting_since
    succeeded = body.outcome == ReportOutcome.SUCCEEDED
    result = AttemptOutcome(
        RunOutcome.SUCCESS if succeeded else RunOutcome.FAILED,
        status_code=202 if started is not None else None,
        error=None if succeeded else (body.error or f"the receiver reported {body.outcome.value}"),
        duration_ms=None if started is None else int((attempt.db_now - started).total_seconds() * 1000),
        started_at=started,
        retryable=body.outcome == ReportOutcome.RETRY,
        retry_after_s=body.retry_after_s,
    )
    step = after_attempt(
        job.attempt_context(),
        succeeded,
        attempt.db_now,
        _rng,
        retryable=result.retryable,
        retry_after_s=result.retry_after_s,
    )
    return FinishedAttempt(job, result, step)
