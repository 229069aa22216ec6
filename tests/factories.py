"""Factories that build rows through the store (no hand-written SQL in tests)."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from sqlalchemy import func, update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.job import NewJob
from app.domain.payload import payload_json
from app.domain.retry import RetryPolicy
from app.domain.schedule import IntervalSchedule, OnceSchedule, Schedule
from app.store.job_rows_new import PreparedJob
from app.store.jobs import db_now, job_create, job_create_many
from app.store.tables import jobs
from app.store.targets import target_create
from app.store.tenants import tenant_ensure
from tests.conftest import TEST_KEY_RING


async def make_tenant_and_target(engine: AsyncEngine, url: str, timeout_s: float = 2.0) -> tuple[uuid.UUID, uuid.UUID]:
    async with engine.begin() as conn:
        tenant_id = await tenant_ensure(conn, f"t-{uuid.uuid4().hex[:8]}")
        row, _ = await target_create(conn, TEST_KEY_RING, tenant_id, name="t", url=url, headers={}, timeout_s=timeout_s)
    return tenant_id, row["id"]


async def make_jobs(
    engine: AsyncEngine,
    tenant_id: uuid.UUID,
    target_id: uuid.UUID,
    count: int = 1,
    *,
    due_in_s: float = -1.0,
    schedule: Schedule | None = None,
    max_attempts: int = 3,
    backoff_base_s: float = 0.01,
    payload: Any = None,
) -> list[uuid.UUID]:
    ids = []
    async with engine.begin() as conn:
        now = await db_now(conn)
        fire = now + dt.timedelta(seconds=due_in_s)
        for i in range(count):
            new = NewJob(
                tenant_id=tenant_id,
                target_id=target_id,
                name=None,
                payload={"n": i} if payload is None else payload,
                priority=0,
                schedule=schedule or OnceSchedule(fire),
                first_fire_at=fire,
                policy=RetryPolicy(max_attempts, backoff_base_s, backoff_base_s * 4),
            )
            row = await job_create(conn, PreparedJob.of(new, payload_json(new.payload)))
            ids.append(row["id"])
    return ids


async def expire_leases(engine: AsyncEngine) -> None:
    """Moves every lease into the past, as if its scheduler had died long ago."""
    async with engine.begin() as conn:
        await conn.execute(
            update(jobs)
            .where(jobs.c.state == "running")
            .values(lease_expires_at=jobs.c.lease_expires_at - dt.timedelta(hours=1))
        )


def every(seconds: int) -> IntervalSchedule:
    return IntervalSchedule(seconds)


async def make_jobs_bulk(
    engine: AsyncEngine,
    tenant_id: uuid.UUID,
    target_id: uuid.UUID,
    count: int,
    *,
    due_in_s: float = -1.0,
    spread_s: float = 0.0,
    max_attempts: int = 5,
    backoff_base_s: float = 0.05,
    chunk: int = 1000,
) -> list[uuid.UUID]:
    """Many one-off jobs in multi-row INSERTs; with `spread_s`, due times spread evenly over it."""
    ids: list[uuid.UUID] = []
    policy = RetryPolicy(max_attempts, backoff_base_s, backoff_base_s * 4)
    async with engine.begin() as conn:
        now = await db_now(conn)
    for start in range(0, count, chunk):
        news = []
        for i in range(start, min(count, start + chunk)):
            fire = now + dt.timedelta(seconds=due_in_s + spread_s * i / max(1, count))
            new = NewJob(tenant_id, target_id, None, {"n": i}, 0, OnceSchedule(fire), fire, policy)
            news.append(PreparedJob.of(new, payload_json(new.payload)))
        async with engine.begin() as conn:
            ids.extend(row["id"] for row in await job_create_many(conn, news))
    return ids


async def backdate(engine: AsyncEngine, column: Any, ids: list[uuid.UUID], days: float) -> None:
    """Sets `column` (jobs.c.finished_at, dead_letters.c.created_at, ...) of the rows with
    these ids to `days` before the database's now(), as if they had aged that long."""
    table = column.table
    async with engine.begin() as conn:
        await conn.execute(
            update(table).where(table.c.id.in_(ids)).values({column.name: func.now() - dt.timedelta(days=days)})
        )
