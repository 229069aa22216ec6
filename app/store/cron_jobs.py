"""Cron jobs as stored, for maintenance commands (`cronhook cron-check`): read-only."""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass

from sqlalchemy import func, select

from app.db.async_engine import AsyncConnection
from app.domain.schedule import ScheduleKind
from app.domain.states import TERMINAL_STATES
from app.store.tables import jobs, tenants


@dataclass(frozen=True)
class StoredCronJob:
    id: uuid.UUID
    tenant: str
    name: str | None
    cron: str
    timezone: str
    state: str


# Unfinished jobs only: a finished one never fires again, whatever its expression means.
_LIST_UNFINISHED = (
    select(jobs.c.id, tenants.c.name.label("tenant"), jobs.c.name, jobs.c.cron, jobs.c.timezone, jobs.c.state)
    .join(tenants, tenants.c.id == jobs.c.tenant_id)
    .where(jobs.c.schedule_kind == ScheduleKind.CRON, jobs.c.state.not_in(sorted(TERMINAL_STATES)))
    .order_by(tenants.c.name, jobs.c.created_at, jobs.c.id)
)


async def cron_job_list_unfinished(conn: AsyncConnection) -> tuple[dt.datetime, list[StoredCronJob]]:
    """The database's now() and every unfinished cron job, by tenant and age."""
    now: dt.datetime | None = await conn.scalar(select(func.now()))
    assert now is not None
    rows = (await conn.execute(_LIST_UNFINISHED)).mappings()
    return now, [
        StoredCronJob(
            id=row["id"],
            tenant=row["tenant"],
            name=row["name"],
            cron=row["cron"],
            timezone=row["timezone"],
            state=str(row["state"]),
        )
        for row in rows
    ]
