"""Named schedules in the store: the job a tenant's key names (among its unfinished jobs),
read, or locked with the key itself, and the key given to a new job."""

from __future__ import annotations

import uuid

from sqlalchemy import ColumnElement, and_, func, select, update
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection

from app.domain.states import TERMINAL_STATES
from app.store.tables import jobs

_TERMINAL = sorted(state.value for state in TERMINAL_STATES)


def _named(tenant_id: uuid.UUID, key: str) -> ColumnElement[bool]:
    return and_(jobs.c.tenant_id == tenant_id, jobs.c.schedule_key == key, jobs.c.state.not_in(_TERMINAL))


async def job_by_key(conn: AsyncConnection, tenant_id: uuid.UUID, key: str) -> RowMapping | None:
    return (await conn.execute(select(jobs).where(_named(tenant_id, key)))).mappings().one_or_none()


async def job_lock_by_key(conn: AsyncConnection, tenant_id: uuid.UUID, key: str) -> RowMapping | None:
    """The job the key names, row-locked, with the key itself locked for this transaction (a
    transaction-level advisory lock on the tenant and key): concurrent upserts of one key
    queue here, so the first creates and the others find its job."""
    await conn.execute(select(func.pg_advisory_xact_lock(func.hashtextextended(f"schedule:{tenant_id}:{key}", 0))))
    stmt = select(jobs).where(_named(tenant_id, key)).with_for_update()
    return (await conn.execute(stmt)).mappings().one_or_none()


async def job_set_key(conn: AsyncConnection, job_id: uuid.UUID, key: str) -> RowMapping:
    """Names a job just created in this transaction; the row as it is now."""
    stmt = update(jobs).where(jobs.c.id == job_id).values(schedule_key=key).returning(*jobs.c)
    return (await conn.execute(stmt)).mappings().one()
