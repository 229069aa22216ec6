"""Runs: one row per delivery attempt (or rescued lease) of a job."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.engine import RowMapping

from app.db.async_engine import AsyncConnection
from app.domain.completion import ASYNC_OWNER
from app.domain.states import JobState
from app.store.tables import jobs, runs


async def run_insert_many(conn: AsyncConnection, rows: list[dict[str, Any]]) -> None:
    """One multi-row INSERT (SQLAlchemy's insertmanyvalues) for a batch of attempts."""
    await conn.execute(runs.insert(), rows)


async def run_list_for_job(
    conn: AsyncConnection,
    tenant_id: uuid.UUID,
    job_id: uuid.UUID,
    limit: int,
    cursor_id: int | None,
    *,
    newest_first: bool = False,
) -> list[RowMapping] | None:
    """Oldest first (newest first with `newest_first`), from the run after `cursor_id` in that
    order. None when the job does not exist for this tenant."""
    owner = await conn.scalar(select(jobs.c.id).where(jobs.c.id == job_id, jobs.c.tenant_id == tenant_id))
    if owner is None:
        return None
    # A job's runs include its children's: the occurrences it handed off or that were triggered.
    children = select(jobs.c.id).where(jobs.c.parent_job_id == job_id, jobs.c.tenant_id == tenant_id)
    # The chained occurrences' cause (their job's): the parent occurrence each ran after.
    cause = select(jobs.c.cause_id).where(jobs.c.id == runs.c.job_id).scalar_subquery().label("cause_id")
    stmt = select(runs, cause).where(or_(runs.c.job_id == job_id, runs.c.job_id.in_(children)))
    if cursor_id is not None:
        stmt = stmt.where(runs.c.id < cursor_id if newest_first else runs.c.id > cursor_id)
    stmt = stmt.order_by(runs.c.id.desc() if newest_first else runs.c.id).limit(limit)
    return list((await conn.execute(stmt)).mappings().all())


async def job_open_attempts(conn: AsyncConnection, tenant_id: uuid.UUID, job_id: uuid.UUID) -> list[RowMapping]:
    """The open async attempts among the job and its children (rows of jobs): shown as runs
    next to its newest ones (they have no run row until they end)."""
    children = select(jobs.c.id).where(jobs.c.parent_job_id == job_id, jobs.c.tenant_id == tenant_id)
    stmt = (
        select(jobs)
        .where(
            or_(jobs.c.id == job_id, jobs.c.id.in_(children)),
            jobs.c.tenant_id == tenant_id,
            jobs.c.state == JobState.RUNNING,
            jobs.c.lease_owner == ASYNC_OWNER,
        )
        .order_by(jobs.c.awaiting_since)
    )
    return list((await conn.execute(stmt)).mappings().all())
