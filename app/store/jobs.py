"""Jobs, the API side: create, read, and the user's state changes (cancel, pause, resume,
PATCH). The INSERTs are job_inserts.py's (a new job's row: job_rows_new.py); the scheduler's
and the reaper's statements are claim_statements.py's, claims.py's, lease_writes.py's, outcomes.py's and rescues.py's.

Every statement that changes a job's state names the states it expects; one that matches no
row means the job is in another state (or absent), which the caller reports.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from sqlalchemy import Text, and_, case, cast, func, literal, or_, select, update
from sqlalchemy.engine import RowMapping

from app.db.async_engine import AsyncConnection
from app.domain.health import Health
from app.domain.schedule import ScheduleKind
from app.domain.states import CANCELLABLE_STATES, PAUSABLE_STATES, JobState
from app.store.completions import job_open_attempt_for_cancel, run_insert_cancelled
from app.store.health import health_column, with_health
from app.store.job_inserts import job_insert_many
from app.store.job_rows import NO_LEASE
from app.store.job_rows_new import PreparedJob
from app.store.tables import job_state, jobs

_NOW = select(func.now())


async def db_now(conn: AsyncConnection) -> dt.datetime:
    value: dt.datetime | None = await conn.scalar(_NOW)
    assert value is not None
    return value


async def job_create(conn: AsyncConnection, job: PreparedJob) -> RowMapping:
    """Inserts the job (its target share-locked by the caller)."""
    (row,) = await job_insert_many(conn, [job])
    return row


async def job_create_many(conn: AsyncConnection, batch: list[PreparedJob]) -> list[RowMapping]:
    """One INSERT (built once, app/store/job_inserts.py); rows come back in the order of `batch`."""
    return await job_insert_many(conn, batch)


# A job as the API answers it: every column, and the health it shows (app/store/health.py).
_JOB = (*jobs.c, health_column())


async def job_get(conn: AsyncConnection, tenant_id: uuid.UUID, job_id: uuid.UUID) -> RowMapping | None:
    stmt = select(*_JOB).where(jobs.c.id == job_id, jobs.c.tenant_id == tenant_id)
    return (await conn.execute(stmt)).mappings().one_or_none()


async def job_list(
    conn: AsyncConnection,
    tenant_id: uuid.UUID,
    limit: int,
    after: tuple[dt.datetime, uuid.UUID] | None,
    state: JobState | None = None,
    target_id: uuid.UUID | None = None,
    parent_job_id: uuid.UUID | None = None,
    after_job_id: uuid.UUID | None = None,
    labels: dict[str, str] | None = None,
    with_payload: bool = True,
    with_payload_bytes: bool = False,
    health: Health | None = None,
    search: str | None = None,
) -> list[RowMapping]:
    """Newest first, each with the health it shows (only those showing `health`, if given).
    `search` is a job id, or a part of its name or schedule key (any case).
    Without `with_payload`, a page's memory does not grow with payload sizes;
    `with_payload_bytes` adds each payload's JSON text size (`payload_bytes`)."""
    columns: list[Any] = [*jobs.c] if with_payload else [*LIST_COLUMNS]
    if with_payload_bytes:
        columns.append(func.octet_length(cast(jobs.c.payload, Text)).label("payload_bytes"))
    stmt = with_health(select(*columns).where(jobs.c.tenant_id == tenant_id), health)
    if state is not None:
        stmt = stmt.where(jobs.c.state == state)
    if target_id is not None:
        stmt = stmt.where(jobs.c.target_id == target_id)
    if parent_job_id is not None:
        stmt = stmt.where(jobs.c.parent_job_id == parent_job_id)
    if after_job_id is not None:
        stmt = stmt.where(jobs.c.after_job_id == after_job_id)
    if labels:
        stmt = stmt.where(jobs.c.labels.contains(labels))
    if search:
        stmt = stmt.where(_matching(search))
    if after is not None:
        created, ident = after
        stmt = stmt.where(or_(jobs.c.created_at < created, and_(jobs.c.created_at == created, jobs.c.id < ident)))
    stmt = stmt.order_by(jobs.c.created_at.desc(), jobs.c.id.desc()).limit(limit)
    return list((await conn.execute(stmt)).mappings().all())


def _matching(search: str) -> Any:
    """A job id matches itself. Otherwise a substring of the name or key: no index serves it
    (one on every create would cost more than the console's search saves), so it reads the
    tenant's jobs newest first until a page is full, bounded by the statement timeout."""
    try:
        return jobs.c.id == uuid.UUID(search)
    except ValueError:
        pattern = "%" + search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        return or_(jobs.c.name.ilike(pattern, escape="\\"), jobs.c.schedule_key.ilike(pattern, escape="\\"))


# Every column but the payload.
LIST_COLUMNS = tuple(column for column in jobs.c if column.name != "payload")


async def job_payloads(conn: AsyncConnection, tenant_id: uuid.UUID, job_ids: list[uuid.UUID]) -> dict[uuid.UUID, Any]:
    stmt = select(jobs.c.id, jobs.c.payload).where(jobs.c.tenant_id == tenant_id, jobs.c.id.in_(job_ids))
    return {row.id: row.payload for row in await conn.execute(stmt)}


async def _job_transition(
    conn: AsyncConnection,
    tenant_id: uuid.UUID,
    job_id: uuid.UUID,
    from_states: tuple[JobState, ...],
    values: dict[str, Any],
) -> RowMapping | None:
    """A user's state change, applied only from `from_states`; None when the job is in
    another state (or absent)."""
    stmt = (
        update(jobs)
        .where(jobs.c.id == job_id, jobs.c.tenant_id == tenant_id, jobs.c.state.in_([s.value for s in from_states]))
        .values(**values, updated_at=func.now())
        .returning(*_JOB)
    )
    return (await conn.execute(stmt)).mappings().one_or_none()


async def job_cancel(conn: AsyncConnection, tenant_id: uuid.UUID, job_id: uuid.UUID) -> RowMapping | None:
    """Cancels a non-terminal job; None when it is already terminal (or absent). An open
    asynchronous attempt ends with a `cancelled` run (its token is fenced from then on).
    Call in a transaction."""
    open_attempt = await job_open_attempt_for_cancel(conn, tenant_id, job_id)
    values = {"state": JobState.CANCELLED, "run_at": None, "finished_at": func.now(), **NO_LEASE}
    row = await _job_transition(conn, tenant_id, job_id, CANCELLABLE_STATES, values)
    if row is not None and open_attempt is not None:
        await run_insert_cancelled(conn, tenant_id, job_id, open_attempt)
    return row


async def job_lock(conn: AsyncConnection, tenant_id: uuid.UUID, job_id: uuid.UUID) -> RowMapping | None:
    """The job, row-locked for this transaction (a change computed from it stays valid)."""
    stmt = select(*_JOB).where(jobs.c.id == job_id, jobs.c.tenant_id == tenant_id).with_for_update(of=jobs)
    return (await conn.execute(stmt)).mappings().one_or_none()


async def job_pause(conn: AsyncConnection, tenant_id: uuid.UUID, job_id: uuid.UUID) -> RowMapping | None:
    """Stops a waiting job from being claimed; None when it is not pausable (or absent)."""
    return await _job_transition(conn, tenant_id, job_id, PAUSABLE_STATES, {"state": JobState.PAUSED, "run_at": None})


async def job_resume(conn: AsyncConnection, tenant_id: uuid.UUID, job_id: uuid.UUID) -> RowMapping | None:
    """Makes a paused job claimable again; None when it is not paused (or absent).

    The current occurrence keeps its nominal time: if that passed during the pause, the job is
    due at once and the scheduler settles the missed fire times by the job's misfire policy.
    A paused retry resumes as a retry, due now.
    """
    retrying = jobs.c.attempt > 0
    values = {
        "state": case(
            (retrying, cast(literal(JobState.RETRYING.value), job_state)),
            else_=cast(literal(JobState.SCHEDULED.value), job_state),
        ),
        # A chained job has no fire time of its own: resumed, it is armed again.
        "run_at": case(
            (retrying, func.now()), (jobs.c.schedule_kind == ScheduleKind.AFTER, None), else_=jobs.c.scheduled_for
        ),
        # Health: fire times the pause kept from running are not failures (app/domain/health.py).
        "resumed_at": func.now(),
    }
    return await _job_transition(conn, tenant_id, job_id, (JobState.PAUSED,), values)


async def job_update(
    conn: AsyncConnection, job_id: uuid.UUID, expected: JobState, changes: dict[str, Any]
) -> RowMapping | None:
    """Applies `changes` (column -> value) if the job is still in state `expected`."""
    stmt = (
        update(jobs)
        .where(jobs.c.id == job_id, jobs.c.state == expected)
        .values(**changes, updated_at=func.now())
        .returning(*_JOB)
    )
    return (await conn.execute(stmt)).mappings().one_or_none()
