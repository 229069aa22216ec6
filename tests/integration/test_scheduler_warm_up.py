"""A scheduler's warm-up, before it takes any partition: the sessions it opens have every
statement of a burst's delivery path prepared (the claim, the claim that skips tenants at
their share, the outcome batch), so that the first burst pays neither their compilation nor
their first plan; and it takes, writes and holds nothing."""

from __future__ import annotations

import contextlib

from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.engine import create_engine
from app.services.scheduler import WARM_SESSIONS, Scheduler
from app.services.scheduler_config import SchedulerConfig
from app.settings import Settings
from app.store.tables import jobs, partition_leases, runs
from tests.conftest import TEST_KEY_RING
from tests.factories import make_jobs, make_tenant_and_target


async def _prepared_on(conn: AsyncConnection) -> list[str]:
    return list((await conn.execute(text("SELECT statement FROM pg_prepared_statements"))).scalars())


def _burst_path_prepared(prepared: list[str]) -> bool:
    claims = [s for s in prepared if "FOR UPDATE" in s and "SKIP LOCKED" in s]
    # Both claims: one of them skips the tenants at their share (full_tenants).
    skipping = [s for s in claims if "tenants.id != ALL" in s]
    outcome_batch = [s for s in prepared if "unnest(" in s and "INSERT INTO runs" in s]
    return len(claims) == 2 and len(skipping) == 1 and len(outcome_batch) == 1


async def test_warm_up_prepares_the_burst_path_on_its_sessions_and_takes_nothing(
    db_url: str, settings: Settings
) -> None:
    seed = create_engine(db_url, pool_size=2)
    tenant, target = await make_tenant_and_target(seed, "http://127.0.0.1:9/")
    await make_jobs(seed, tenant, target, 5)  # due now: a claim that counted would take them
    await seed.dispose()
    # As a scheduler process's engine: generic plans, autocommit sessions on the driver.
    engine = create_engine(db_url, pool_size=WARM_SESSIONS, generic_plans=True)  # 2 x that pooled
    scheduler = Scheduler(engine, SchedulerConfig.from_settings(settings), TEST_KEY_RING)
    try:
        await scheduler.warm_up()
        async with contextlib.AsyncExitStack() as stack:
            # Every session in the pool at once (each a different one).
            pooled = [
                await stack.enter_async_context(engine.connect())
                for _ in range(engine.pool.checkedin())  # type: ignore[attr-defined]
            ]
            warm = [conn for conn in pooled if _burst_path_prepared(await _prepared_on(conn))]
            # WARM_SESSIONS of them, each a new session (at most half the pool: the process's
            # other services use it too).
            assert len(warm) == WARM_SESSIONS, [await _prepared_on(conn) for conn in pooled]
            conn = pooled[0]
            assert await conn.scalar(select(func.count()).select_from(runs)) == 0
            states = (await conn.execute(select(jobs.c.state, jobs.c.attempt))).all()
            assert {(state.value, attempt) for state, attempt in states} == {("scheduled", 0)}
            assert await conn.scalar(select(func.count()).where(partition_leases.c.owner.is_not(None))) == 0
    finally:
        await scheduler.close()
        await engine.dispose()
