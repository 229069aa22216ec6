"""Jobs, asynchronous completion (app/domain/completion.py): opening an attempt the receiver
accepted (202), its heartbeats, the lock a report takes on it, the report's result on the
run, a late report's fencing, and open attempts counted.

Every write is guarded by state running and the lease token the delivery was sent under:
a report for an attempt that has ended (rescued, retried, cancelled, timed out) matches no
job row, and is then looked up among the runs (run_fence_report).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import uuid
from typing import Any

from sqlalchemy import (
    DateTime,
    Integer,
    SmallInteger,
    Text,
    any_,
    bindparam,
    case,
    cast,
    func,
    literal,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, UUID
from sqlalchemy.engine import RowMapping

from app.db.async_engine import AsyncConnection
from app.domain.completion import ASYNC_OWNER, CompletionMode
from app.domain.job import ClaimedJob, OpenedAttempt, RunOutcome
from app.domain.states import PAUSABLE_STATES, TERMINAL_STATES, JobState
from app.keyring import KeyRing
from app.store.job_rows import CLAIMED_JOB_COLUMNS, claimed_from_row
from app.store.tables import jobs, runs, state_in, state_in_rows_by_id, targets

_UUIDS = ARRAY(UUID(as_uuid=True))


def _seconds(value: Any) -> Any:
    return func.make_interval(0, 0, 0, 0, 0, 0, value)


@functools.cache
def _open_statement() -> Any:
    """The batch's 202s: each job's lease passes to ASYNC_OWNER with its deadlines."""
    opened = (
        func.unnest(
            bindparam("ids", type_=_UUIDS),
            bindparam("leases", type_=_UUIDS),
            bindparam("digests", type_=ARRAY(Text)),
            bindparam("started", type_=ARRAY(DateTime(timezone=True))),
            bindparam("timeouts", type_=ARRAY(Integer)),
            bindparam("heartbeats", type_=ARRAY(Integer)),
        )
        .table_valued("id", "lease", "digest", "started", "timeout_s", "heartbeat_s")
        .render_derived(name="opened")
    )
    started = cast(opened.c.started, DateTime(timezone=True))
    deadline = started + _seconds(cast(opened.c.timeout_s, Integer))
    # The heartbeat deadline counts from the 202's record (a heartbeat may have come first).
    heartbeat_deadline = func.now() + _seconds(cast(opened.c.heartbeat_s, Integer))
    return (
        update(jobs)
        .where(
            jobs.c.id == opened.c.id,
            state_in_rows_by_id([JobState.RUNNING]),
            jobs.c.lease_token == opened.c.lease,
        )
        .values(
            lease_owner=ASYNC_OWNER,
            async_deadline_at=deadline,
            # least() ignores a NULL: no heartbeat timeout, only the deadline.
            lease_expires_at=func.least(deadline, heartbeat_deadline),
            awaiting_since=started,
            completion_token_hash=cast(opened.c.digest, Text),
            last_status_code=202,
            last_error=None,
            updated_at=func.now(),
        )
        .returning(jobs.c.id, jobs.c.lease_token)
    )


async def job_open_async_attempts(
    conn: AsyncConnection, items: list[OpenedAttempt]
) -> set[tuple[uuid.UUID, uuid.UUID]]:
    """Records accepted async deliveries (one statement for the batch); returns the (job id,
    lease token) pairs applied. One missing was fenced, or already reported on: a receiver
    may report before its 202 is recorded, which finishes the attempt under the scheduler's
    lease (the report then wins, and this write matches nothing)."""
    if not items:
        return set()
    params = {
        "ids": [item.job.id for item in items],
        "leases": [item.job.lease_token for item in items],
        "digests": [item.token_digest for item in items],
        "started": [item.result.started_at for item in items],
        "timeouts": [item.job.completion.async_timeout_s for item in items],
        "heartbeats": [item.job.completion.heartbeat_timeout_s for item in items],
    }
    rows = await conn.execute(_open_statement(), params)
    return {(row.id, row.lease_token) for row in rows}


@dataclasses.dataclass(frozen=True)
class OpenAttempt:
    """An attempt a report may finish, row-locked: the job as claimed, and since when (and
    whether) it is open."""

    job: ClaimedJob
    # The attempt's start (its 202 recorded), or None while the scheduler still holds it.
    awaiting_since: dt.datetime | None
    token_hash: str | None
    db_now: dt.datetime
    # A pause waits for this attempt to end (job_apply_requested_pauses).
    pause_requested: bool = False


@functools.cache
def _read_statement(lock: bool) -> Any:
    """Unlocked, the read leaves the payload out (an empty text): it serves only finishes of
    one statement, which write no dead letter; the locked read, for the others, has it."""
    columns = [
        column if lock or column.name != "payload_json" else literal("", Text).label("payload_json")
        for column in CLAIMED_JOB_COLUMNS
    ]
    stmt = (
        select(*columns, jobs.c.awaiting_since, jobs.c.completion_token_hash, jobs.c.pause_requested_at)
        .join(targets, targets.c.id == jobs.c.target_id)
        .where(
            jobs.c.id == bindparam("job_id"),
            state_in([JobState.RUNNING]),
            jobs.c.lease_token == bindparam("lease_token"),
        )
    )
    return stmt.with_for_update(of=jobs) if lock else stmt


async def job_read_open_attempt(
    conn: AsyncConnection, key_ring: KeyRing, job_id: uuid.UUID, lease_token: uuid.UUID, *, lock: bool
) -> OpenAttempt | None:
    """The attempt under this lease (row-locked for the transaction with `lock`); None when
    it has ended. Unlocked, a write made from it must be guarded by the lease token (the
    finish statement is), since the attempt may end meanwhile."""
    params = {"job_id": job_id, "lease_token": lease_token}
    row = (await conn.execute(_read_statement(lock), params)).mappings().first()
    if row is None:
        return None
    paused = row["pause_requested_at"] is not None
    job = claimed_from_row(row, key_ring)
    return OpenAttempt(job, row["awaiting_since"], row["completion_token_hash"], row["claimed_at"], paused)


@functools.cache
def _heartbeat_statement() -> Any:
    heartbeat_s = func.coalesce(jobs.c.heartbeat_timeout_s, targets.c.heartbeat_timeout_s)
    # Parameters named apart from jobs' columns: one named like a column would become a SET.
    progress = bindparam("new_progress", type_=SmallInteger)
    message = bindparam("new_message", type_=Text)
    return (
        update(jobs)
        .where(
            jobs.c.id == bindparam("job_id"),
            state_in([JobState.RUNNING]),
            jobs.c.lease_token == bindparam("attempt_lease"),
            # Recorded with the 202 (before it, the token's MAC alone vouches for it).
            jobs.c.completion_token_hash.is_(None) | (jobs.c.completion_token_hash == bindparam("digest")),
            targets.c.id == jobs.c.target_id,
        )
        .values(
            last_heartbeat_at=func.now(),
            progress=func.coalesce(progress, jobs.c.progress),
            progress_message=func.coalesce(message, jobs.c.progress_message),
            # Pushed out by the heartbeat timeout, never past the attempt's deadline. Before
            # the 202 is recorded the scheduler's lease stands (the 202 sets the deadlines).
            lease_expires_at=case(
                (
                    jobs.c.lease_owner == ASYNC_OWNER,
                    func.least(jobs.c.async_deadline_at, func.now() + _seconds(heartbeat_s)),
                ),
                else_=jobs.c.lease_expires_at,
            ),
        )
        .returning(jobs.c.id)
    )


async def job_heartbeat(
    conn: AsyncConnection,
    job_id: uuid.UUID,
    lease_token: uuid.UUID,
    digest: str,
    progress: int | None,
    message: str | None,
) -> bool:
    """Records a heartbeat of the attempt under this lease; False when it has ended."""
    params = {
        "job_id": job_id,
        "attempt_lease": lease_token,
        "digest": digest,
        "new_progress": progress,
        "new_message": message,
    }
    return (await conn.execute(_heartbeat_statement(), params)).first() is not None


async def job_attempt_open(conn: AsyncConnection, job_id: uuid.UUID, lease_token: uuid.UUID) -> bool:
    """Whether the job still runs the attempt under this lease."""
    stmt = select(jobs.c.id).where(jobs.c.id == job_id, state_in([JobState.RUNNING]), jobs.c.lease_token == lease_token)
    return (await conn.scalar(stmt)) is not None


@dataclasses.dataclass(frozen=True)
class EndedAttempt:
    outcome: str
    # The receiver reported on it already (or it succeeded synchronously): a 409, not a 410.
    finished_by_receiver: bool


async def run_fence_report(conn: AsyncConnection, job_id: uuid.UUID, lease_token: uuid.UUID) -> EndedAttempt | None:
    """A report for an attempt that has ended: its run, marked `fenced_at` unless the
    receiver had finished it (then the report is merely a repeat). None when no run was
    written for it (no attempt under that lease ended with a run: a cancel before any)."""
    by_receiver = runs.c.reported_at.is_not(None) | (runs.c.outcome == RunOutcome.SUCCESS.value)
    stmt = (
        update(runs)
        .where(runs.c.job_id == job_id, runs.c.lease_token == lease_token)
        .values(fenced_at=case((by_receiver, runs.c.fenced_at), else_=func.now()))
        .returning(runs.c.outcome, by_receiver.label("by_receiver"))
    )
    row = (await conn.execute(stmt)).first()
    return None if row is None else EndedAttempt(row.outcome, bool(row.by_receiver))


async def job_open_attempt_for_cancel(conn: AsyncConnection, tenant_id: uuid.UUID, job_id: uuid.UUID) -> Any:
    """The job's open asynchronous attempt (lease and occurrence), row-locked, or None: a
    cancel closes it with a run of its own, so its token is fenced with a record of why."""
    stmt = (
        select(
            jobs.c.lease_token,
            jobs.c.occurrence_id,
            jobs.c.scheduled_for,
            jobs.c.attempt,
            jobs.c.awaiting_since,
            jobs.c.last_status_code,
        )
        .where(jobs.c.id == job_id, jobs.c.tenant_id == tenant_id, jobs.c.lease_owner == ASYNC_OWNER)
        .with_for_update()
    )
    return (await conn.execute(stmt)).first()


async def run_insert_cancelled(conn: AsyncConnection, tenant_id: uuid.UUID, job_id: uuid.UUID, attempt: Any) -> None:
    await conn.execute(
        runs.insert().values(
            job_id=job_id,
            tenant_id=tenant_id,
            occurrence_id=attempt.occurrence_id,
            scheduled_for=attempt.scheduled_for,
            attempt=attempt.attempt,
            replica_id=ASYNC_OWNER,
            started_at=attempt.awaiting_since,
            status_code=attempt.last_status_code,
            duration_ms=cast(
                func.extract("epoch", func.now() - cast(literal(attempt.awaiting_since), DateTime(timezone=True)))
                * 1000,
                Integer,
            ),
            outcome=RunOutcome.CANCELLED.value,
            error="cancelled while awaiting the receiver's completion",
            lease_token=attempt.lease_token,
        )
    )


async def job_count_open_async(conn: AsyncConnection) -> int:
    """Open asynchronous attempts across all tenants (a gauge)."""
    stmt = select(func.count()).where(state_in([JobState.RUNNING]), jobs.c.lease_owner == ASYNC_OWNER)
    return int(await conn.scalar(stmt) or 0)


async def async_completion_in_use(conn: AsyncConnection) -> bool:
    """Whether any live target, or any unfinished job, is in async completion mode."""
    async_target = select(targets.c.id).where(
        targets.c.completion == CompletionMode.ASYNC.value, targets.c.deleted_at.is_(None)
    )
    async_job = select(jobs.c.id).where(jobs.c.completion == CompletionMode.ASYNC.value, ~state_in(TERMINAL_STATES))
    return bool(await conn.scalar(select(async_target.exists() | async_job.exists())))


async def job_request_pause(conn: AsyncConnection, tenant_id: uuid.UUID, job_id: uuid.UUID) -> RowMapping | None:
    """A pause of a job whose async attempt is open: noted, applied when the attempt ends
    (job_apply_requested_pauses); None when no attempt is open."""
    stmt = (
        update(jobs)
        .where(
            jobs.c.id == job_id,
            jobs.c.tenant_id == tenant_id,
            state_in([JobState.RUNNING]),
            jobs.c.lease_owner == ASYNC_OWNER,
        )
        .values(pause_requested_at=func.coalesce(jobs.c.pause_requested_at, func.now()), updated_at=func.now())
        .returning(*jobs.c)
    )
    return (await conn.execute(stmt)).mappings().one_or_none()


async def job_withdraw_pause(conn: AsyncConnection, tenant_id: uuid.UUID, job_id: uuid.UUID) -> RowMapping | None:
    """A resume before the pause it follows took effect: the pause is withdrawn; None when
    no pause is pending."""
    stmt = (
        update(jobs)
        .where(
            jobs.c.id == job_id,
            jobs.c.tenant_id == tenant_id,
            state_in([JobState.RUNNING]),
            jobs.c.pause_requested_at.is_not(None),
        )
        .values(pause_requested_at=None, updated_at=func.now())
        .returning(*jobs.c)
    )
    return (await conn.execute(stmt)).mappings().one_or_none()


async def job_apply_requested_pauses(conn: AsyncConnection, job_ids: list[uuid.UUID]) -> None:
    """Jobs whose attempt just ended (a report, a timeout) with a pause pending: paused if
    they wait for a next occurrence or a retry; the request dropped in any case."""
    if not job_ids:
        return
    pending = (jobs.c.id == any_(literal(job_ids, _UUIDS)), jobs.c.pause_requested_at.is_not(None))
    await conn.execute(
        update(jobs)
        .where(*pending, state_in(PAUSABLE_STATES))
        .values(state=JobState.PAUSED, run_at=None, pause_requested_at=None, updated_at=func.now())
    )
    await conn.execute(update(jobs).where(*pending).values(pause_requested_at=None))
