"""Retention (app/store/retention.py) through the reaper's run_once: old finished jobs and
their runs go, in batches; dead letters stay unless their own retention is set; a recurring
job keeps its newest runs. Rows are aged on the database's clock (tests.factories.backdate).
"""

from __future__ import annotations

import uuid

from sqlalchemy import ColumnElement, FromClause, func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.services.reaper import Reaper, ReaperConfig
from app.services.scheduler import Scheduler
from app.services.scheduler_config import SchedulerConfig
from app.settings import Settings
from app.store.jobs import db_now
from app.store.runs import run_insert_many
from app.store.tables import dead_letters, jobs, runs
from tests.conftest import TEST_KEY_RING
from tests.factories import backdate, every, make_jobs, make_tenant_and_target
from tests.receiver import Receiver, Reply, wait_for


async def job_states(engine: AsyncEngine, ids: list[uuid.UUID]) -> dict[uuid.UUID, str]:
    async with engine.connect() as conn:
        rows = await conn.execute(select(jobs.c.id, jobs.c.state).where(jobs.c.id.in_(ids)))
        return {row.id: row.state.value for row in rows}


async def count(engine: AsyncEngine, table: FromClause, *conditions: ColumnElement[bool]) -> int:
    async with engine.connect() as conn:
        return int(await conn.scalar(select(func.count()).select_from(table).where(*conditions)) or 0)


async def deliver_all(engine: AsyncEngine, settings: Settings, ids: list[uuid.UUID], state: str) -> None:
    scheduler = Scheduler(engine, SchedulerConfig.from_settings(settings), TEST_KEY_RING)
    try:

        async def settled() -> bool:
            await scheduler.run_once()
            return set((await job_states(engine, ids)).values()) == {state}

        await wait_for(settled, timeout=30, message=f"jobs {state}")
    finally:
        await scheduler.close(grace_s=5)


async def test_finished_jobs_past_retention_go_with_their_runs_and_dead_letters_stay(
    engine: AsyncEngine, settings: Settings, receiver: Receiver
) -> None:
    tenant, target = await make_tenant_and_target(engine, receiver.url())
    receiver.default = Reply(status=410)  # not retryable: dead-lettered at once
    dead = await make_jobs(engine, tenant, target, 2, max_attempts=1)
    await deliver_all(engine, settings, dead, "dead")
    receiver.default = Reply()
    old = await make_jobs(engine, tenant, target, 3)
    recent = await make_jobs(engine, tenant, target, 2)
    await deliver_all(engine, settings, old + recent, "succeeded")
    waiting = await make_jobs(engine, tenant, target, 1, due_in_s=3600)
    await backdate(engine, jobs.c.finished_at, old + dead, days=settings.retention_days + 1)
    await backdate(engine, jobs.c.finished_at, recent, days=settings.retention_days - 1)
    assert await count(engine, runs, runs.c.job_id.in_(old)) == 3

    counts = await Reaper(engine, ReaperConfig.from_settings(settings), TEST_KEY_RING).run_once()
    assert counts.retention.jobs_deleted == 3 and counts.retention.dead_letters_deleted == 0
    assert set(await job_states(engine, old + dead + recent + waiting)) == set(dead + recent + waiting)
    assert await count(engine, runs, runs.c.job_id.in_(old)) == 0, "runs go with their job"
    # A dead job is kept while its dead letter is: dead letters stay until deleted by default.
    assert await count(engine, dead_letters, dead_letters.c.job_id.in_(dead)) == 2
    assert (
        await Reaper(engine, ReaperConfig.from_settings(settings), TEST_KEY_RING).run_once()
    ).retention.jobs_deleted == 0

    # With a dead-letter retention, old dead letters go, then their dead jobs.
    async with engine.connect() as conn:
        letters = list((await conn.execute(select(dead_letters.c.id))).scalars())
    await backdate(engine, dead_letters.c.created_at, letters, days=8)
    config = ReaperConfig(dead_letter_retention_days=7, retention_days=settings.retention_days)
    counts = await Reaper(engine, config, TEST_KEY_RING).run_once()
    assert counts.retention.dead_letters_deleted == 2 and counts.retention.jobs_deleted == 2
    assert set(await job_states(engine, old + dead + recent + waiting)) == set(recent + waiting)


async def test_deletes_run_in_batches_and_a_recurring_job_keeps_its_newest_runs(engine: AsyncEngine) -> None:
    tenant, target = await make_tenant_and_target(engine, "http://127.0.0.1:9/")
    busy, quiet = await make_jobs(engine, tenant, target, 2, due_in_s=3600, schedule=every(60))
    kept, batch = 100, 60
    history = {busy: 250, quiet: kept}
    async with engine.begin() as conn:
        now = await db_now(conn)
        for job_id, n in history.items():
            await conn.execute(jobs.update().where(jobs.c.id == job_id).values(occurrences_run=n))
            rows = [
                {
                    "job_id": job_id,
                    "tenant_id": tenant,
                    "occurrence_id": uuid.uuid4(),
                    "scheduled_for": now,
                    "attempt": 1,
                    "outcome": "success",
                }
                for _ in range(n)
            ]
            await run_insert_many(conn, rows)
    async with engine.connect() as conn:
        newest = list(
            (
                await conn.execute(
                    select(runs.c.id).where(runs.c.job_id == busy).order_by(runs.c.id.desc()).limit(kept)
                )
            ).scalars()
        )
    reaper = Reaper(engine, ReaperConfig(runs_kept_per_job=kept, retention_batch_size=batch), TEST_KEY_RING)
    deleted = []
    for _ in range(10):  # bounded: 150 surplus runs in batches of 60
        deleted.append((await reaper.run_once()).retention.runs_deleted)
        if await count(engine, runs, runs.c.job_id == busy) == kept:
            break
    assert max(deleted) <= batch and sum(deleted) == 150
    async with engine.connect() as conn:
        left = set((await conn.execute(select(runs.c.id).where(runs.c.job_id == busy))).scalars())
    assert left == set(newest)
    assert await count(engine, runs, runs.c.job_id == quiet) == kept
