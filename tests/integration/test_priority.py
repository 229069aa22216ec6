"""Priority with aging, as the claim statement applies it on a real PostgreSQL."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.job import NewJob
from app.domain.retry import RetryPolicy
from app.domain.schedule import OnceSchedule
from app.store.claims import job_claim_batch
from app.store.job_rows_new import PreparedJob
from app.store.jobs import db_now, job_create_many
from tests.conftest import TEST_KEY_RING
from tests.factories import make_tenant_and_target


def effective_priority(priority: int, waited_s: float, aging_s: float) -> float:
    """The order the claim takes (app/domain/priority.py): one level more per `aging_s`
    waited since due, no credit before."""
    return priority + max(0.0, waited_s) / aging_s


async def add_jobs(engine: AsyncEngine, jobs: list[tuple[int, float]]) -> list[uuid.UUID]:
    """(priority, seconds relative to now when due) -> job ids, in the same order."""
    tenant, target = await make_tenant_and_target(engine, "http://127.0.0.1:9/unused")
    async with engine.begin() as conn:
        now = await db_now(conn)
        news = []
        for priority, due_in_s in jobs:
            fire = now + dt.timedelta(seconds=due_in_s)
            news.append(NewJob(tenant, target, None, {}, priority, OnceSchedule(fire), fire, RetryPolicy(3, 1.0, 4.0)))
        return [row["id"] for row in await job_create_many(conn, [PreparedJob.of(new, "{}") for new in news])]


async def claim_order(engine: AsyncEngine, count: int, aging_s: float) -> list[uuid.UUID]:
    order: list[uuid.UUID] = []
    for _ in range(count):
        async with engine.begin() as conn:
            claimed = (await job_claim_batch(conn, TEST_KEY_RING, "r", 1, 30, aging_s=aging_s)).jobs
        order.extend(job.id for job in claimed)
    return order


async def test_among_jobs_due_together_higher_priority_goes_first(engine: AsyncEngine) -> None:
    ids = await add_jobs(engine, [(p, -1.0) for p in (3, 9, 0, 5, 7)])
    by_priority = dict(zip((3, 9, 0, 5, 7), ids, strict=True))
    order = await claim_order(engine, 5, aging_s=60)
    assert order == [by_priority[p] for p in (9, 7, 5, 3, 0)]


async def test_a_flood_of_high_priority_work_delays_low_priority_work_but_never_starves_it(
    engine: AsyncEngine,
) -> None:
    # aging 1 s: the priority-0 job, due 20 s ago, has effective priority 20. A priority-9
    # job due d seconds ago has 9 + d: only those due more than 11 s ago go before it.
    flood = [(9, -15.5 + k) for k in range(15)]  # due 15.5 s ... 1.5 s ago
    ids = await add_jobs(engine, [(0, -20.0), *flood])
    low, high = ids[0], ids[1:]
    order = await claim_order(engine, 16, aging_s=1.0)
    assert order == [*high[:5], low, *high[5:]]

    # With slow aging (60 s per level) the same flood goes entirely first.
    ids = await add_jobs(engine, [(0, -20.0), *flood])
    assert (await claim_order(engine, 16, aging_s=60.0))[-1] == ids[0]


@pytest.mark.parametrize("limit", [1, 7, 40])
async def test_a_batch_takes_the_best_jobs_even_when_one_level_holds_more_than_the_batch(
    engine: AsyncEngine, limit: int
) -> None:
    # 40 old low-priority jobs and 40 fresh high-priority ones: the claim must look past the
    # first `limit` rows of each level and still return exactly the `limit` best overall.
    jobs = [(1, -600.0 - i) for i in range(40)] + [(8, -1.0 - i / 100) for i in range(40)]
    ids = await add_jobs(engine, jobs)
    async with engine.begin() as conn:
        claimed = {job.id for job in (await job_claim_batch(conn, TEST_KEY_RING, "r", limit, 30, aging_s=60)).jobs}
    # Priority 1 due 600+ s ago is worth 11+ (the oldest most): they outrank the fresh 8s.
    expected = sorted(range(80), key=lambda i: -effective_priority(jobs[i][0], -jobs[i][1], 60))[:limit]
    assert claimed == {ids[i] for i in expected}
