"""Fair shares in the claim statement, on a real PostgreSQL: a tenant or target at its share
is skipped (its older backlog hides nobody), and a batch keeps each within its free slots."""

from __future__ import annotations

import datetime as dt
import uuid
from collections import Counter

from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.fair_share import ClaimShares
from app.domain.job import ClaimedJob, NewJob
from app.domain.retry import RetryPolicy
from app.domain.schedule import OnceSchedule
from app.store.claims import job_claim_batch
from app.store.job_rows_new import PreparedJob
from app.store.jobs import db_now, job_create_many
from app.store.targets import target_create
from tests.conftest import TEST_KEY_RING
from tests.factories import make_jobs, make_tenant_and_target

UNUSED = "http://127.0.0.1:9/unused"


async def claim(engine: AsyncEngine, limit: int, shares: ClaimShares | None) -> list[ClaimedJob]:
    async with engine.begin() as conn:
        return (await job_claim_batch(conn, TEST_KEY_RING, "r", limit, 30, shares=shares)).jobs


async def test_a_tenant_at_its_share_is_skipped_however_deep_its_older_backlog(engine: AsyncEngine) -> None:
    noisy, noisy_target = await make_tenant_and_target(engine, UNUSED)
    quiet, quiet_target = await make_tenant_and_target(engine, UNUSED)
    async with engine.begin() as conn:  # a deep backlog, due long before
        due = await db_now(conn) - dt.timedelta(minutes=1)
        backlog = NewJob(noisy, noisy_target, None, {}, 0, OnceSchedule(due), due, RetryPolicy(3, 1.0, 4.0))
        for _ in range(3):  # asyncpg takes at most 32,767 parameters a statement
            await job_create_many(conn, [PreparedJob.of(backlog, "{}") for _ in range(1000)])
    (quiet_job,) = await make_jobs(engine, quiet, quiet_target, 1, due_in_s=-1)

    # Without shares the oldest jobs fill the batch (priority aging), the quiet job waits.
    unshared = await claim(engine, 10, None)
    assert {job.tenant_id for job in unshared} == {noisy}

    # The noisy tenant holds its whole share: the claim skips its 2,990 older jobs.
    full = ClaimShares(tenant_free={noisy: 0}, tenant_share=10, target_cap=50)
    assert [job.id for job in await claim(engine, 10, full)] == [quiet_job]


async def test_a_batch_keeps_each_tenant_within_its_free_share(engine: AsyncEngine) -> None:
    busy, busy_target = await make_tenant_and_target(engine, UNUSED)
    holding, holding_target = await make_tenant_and_target(engine, UNUSED)
    other, other_target = await make_tenant_and_target(engine, UNUSED)
    await make_jobs(engine, busy, busy_target, 20, due_in_s=-30)
    await make_jobs(engine, holding, holding_target, 20, due_in_s=-20)
    await make_jobs(engine, other, other_target, 3, due_in_s=-1)

    # `holding` already has 4 deliveries in flight of a share of 6: 2 more; the others 6.
    shares = ClaimShares(tenant_free={holding: 2}, tenant_share=6, target_cap=50)
    claimed = Counter(job.tenant_id for job in await claim(engine, 50, shares))
    assert claimed == {busy: 6, holding: 2, other: 3}


async def test_a_target_without_max_in_flight_gets_its_free_default_slots_and_an_explicit_limit_replaces_it(
    engine: AsyncEngine,
) -> None:
    tenant, capped = await make_tenant_and_target(engine, UNUSED)
    async with engine.begin() as conn:
        row, _ = await target_create(conn, TEST_KEY_RING, tenant, "own-limit", UNUSED, {}, 2.0, max_in_flight=9)
    explicit: uuid.UUID = row["id"]
    await make_jobs(engine, tenant, capped, 20, due_in_s=-10)
    await make_jobs(engine, tenant, explicit, 20, due_in_s=-5)

    shares = ClaimShares(tenant_share=100, target_free={capped: 3}, target_cap=5)
    claimed = await claim(engine, 100, shares)
    assert Counter(job.target_id for job in claimed) == {capped: 3, explicit: 9}
    assert {job.target_max_in_flight for job in claimed} == {None, 9}

    # At its default cap the target is skipped; the other is at its own limit.
    full = ClaimShares(tenant_share=100, target_free={capped: 0}, target_cap=5)
    assert await claim(engine, 100, full) == []
    assert len(await claim(engine, 100, ClaimShares(tenant_share=100, target_cap=5))) == 5


async def test_a_tenant_short_of_share_keeps_its_highest_priority_jobs(engine: AsyncEngine) -> None:
    tenant, target = await make_tenant_and_target(engine, UNUSED)
    async with engine.begin() as conn:
        now = await db_now(conn)
        news = [
            NewJob(tenant, target, None, {}, priority, OnceSchedule(now), now, RetryPolicy(3, 1.0, 4.0))
            for priority in (4, 9, 0, 7, 2, 8)
        ]
        ids = [row["id"] for row in await job_create_many(conn, [PreparedJob.of(new, "{}") for new in news])]
    priority_of = dict(zip(ids, (4, 9, 0, 7, 2, 8), strict=True))
    claimed = await claim(engine, 10, ClaimShares(tenant_free={tenant: 3}, tenant_share=50, target_cap=50))
    assert sorted(priority_of[job.id] for job in claimed) == [7, 8, 9]


async def test_a_scheduler_session_on_generic_plans_claims_the_same_on_its_generic_plans(
    db_url: str, engine: AsyncEngine
) -> None:
    from sqlalchemy import text

    from app.db.engine import create_engine
    from app.domain.partition import PARTITION_COUNT

    noisy, noisy_target = await make_tenant_and_target(engine, UNUSED)
    quiet, quiet_target = await make_tenant_and_target(engine, UNUSED)
    noisy_jobs = await make_jobs(engine, noisy, noisy_target, 3, due_in_s=-30)
    (quiet_job,) = await make_jobs(engine, quiet, quiet_target, 1, due_in_s=-1)
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE partition_leases SET owner = 'r', epoch = 7, expires_at = now() + interval '1 hour'")
        )
    held = dict.fromkeys(range(PARTITION_COUNT), 7)
    scheduler_engine = create_engine(db_url, pool_size=1, generic_plans=True)
    try:
        async with scheduler_engine.begin() as conn:
            assert await conn.scalar(text("SHOW plan_cache_mode")) == "force_generic_plan"
            full = ClaimShares(tenant_free={noisy: 0}, tenant_share=10, target_cap=50)
            skipping = await job_claim_batch(conn, TEST_KEY_RING, "r", 10, 30, held, shares=full)
            # The claim that skips full tenants runs on the session's generic plan too.
            assert await conn.scalar(text("SHOW plan_cache_mode")) == "force_generic_plan"
        assert [job.id for job in skipping.jobs] == [quiet_job]
        async with scheduler_engine.begin() as conn:
            plain = await job_claim_batch(conn, TEST_KEY_RING, "r", 10, 30, held, shares=ClaimShares(tenant_share=10))
            assert await conn.scalar(text("SHOW plan_cache_mode")) == "force_generic_plan"
        assert sorted(job.id for job in plain.jobs) == sorted(noisy_jobs)
    finally:
        await scheduler_engine.dispose()


async def tenant_with_limited_target(engine: AsyncEngine, max_in_flight: int) -> tuple[uuid.UUID, uuid.UUID, uuid.UUID]:
    """A tenant with a target on the default share and one with its own `max_in_flight`."""
    tenant, default = await make_tenant_and_target(engine, UNUSED)
    async with engine.begin() as conn:
        row, _ = await target_create(
            conn, TEST_KEY_RING, tenant, "own-limit", UNUSED, {}, 2.0, max_in_flight=max_in_flight
        )
    return tenant, default, row["id"]


async def test_the_schedulers_autocommit_claim_commits_its_leases_and_keeps_target_limits(
    db_url: str, engine: AsyncEngine
) -> None:
    """A scheduler claims on an autocommit connection (one statement on the driver); the
    candidates of a target with max_in_flight are leased in a transaction of their own."""
    from sqlalchemy import func, select, text

    from app.db.engine import create_engine
    from app.domain.partition import PARTITION_COUNT
    from app.store.tables import jobs

    tenant, capped, explicit = await tenant_with_limited_target(engine, max_in_flight=9)
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE partition_leases SET owner = 'r', epoch = 3, expires_at = now() + interval '1 hour'")
        )
    await make_jobs(engine, tenant, capped, 20, due_in_s=-10)
    await make_jobs(engine, tenant, explicit, 20, due_in_s=-5)
    held = dict.fromkeys(range(PARTITION_COUNT), 3)
    scheduler_engine = create_engine(db_url, pool_size=1, generic_plans=True)
    try:
        async with scheduler_engine.connect() as conn:
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            batch = await job_claim_batch(
                conn, TEST_KEY_RING, "r", 100, 30, held, shares=ClaimShares(tenant_share=100, target_cap=5)
            )
            assert Counter(job.target_id for job in batch.jobs) == {capped: 5, explicit: 9}
            assert conn.sync_connection is not None
            assert conn.sync_connection.get_execution_options()["isolation_level"] == "AUTOCOMMIT"
            # A full tenant: the skipping claim, on the session's generic plans.
            full = ClaimShares(tenant_free={tenant: 0}, tenant_share=100, target_cap=5)
            assert (await job_claim_batch(conn, TEST_KEY_RING, "r", 100, 30, held, shares=full)).jobs == []
            assert await conn.scalar(text("SHOW plan_cache_mode")) == "force_generic_plan"
        # Committed: another session sees the leases, and the limited target at its limit.
        async with engine.connect() as other:
            running = select(jobs.c.target_id, func.count()).where(jobs.c.state == "running", jobs.c.lease_owner == "r")
            counts = dict(tuple(row) for row in await other.execute(running.group_by(jobs.c.target_id)))
        assert counts == {capped: 5, explicit: 9}
        async with scheduler_engine.connect() as conn:
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            more = await job_claim_batch(
                conn, TEST_KEY_RING, "r", 100, 30, held, shares=ClaimShares(tenant_share=100, target_cap=20)
            )
        assert Counter(job.target_id for job in more.jobs) == {capped: 15}, "the limited target is full"
    finally:
        await scheduler_engine.dispose()


async def test_a_limited_candidate_rescheduled_after_the_autocommit_claim_is_not_leased(
    db_url: str, engine: AsyncEngine
) -> None:
    """In autocommit the claim statement's row locks end with it: before a limited target's
    candidates are leased they are locked again and must still be waiting and due."""
    from sqlalchemy import func, text, update

    from app.db.engine import create_engine
    from app.store.claims import _lease_limited
    from app.store.tables import jobs

    tenant, _, limited = await tenant_with_limited_target(engine, max_in_flight=5)
    due, later = await make_jobs(engine, tenant, limited, 2, due_in_s=-5)
    candidates = [{"candidate_id": job_id, "candidate_target_id": limited} for job_id in (due, later)]
    # Meanwhile one of them was delivered elsewhere and waits for its retry.
    async with engine.begin() as conn:
        an_hour_on = func.now() + text("interval '1 hour'")
        await conn.execute(update(jobs).where(jobs.c.id == later).values(state="retrying", run_at=an_hour_on))
    scheduler_engine = create_engine(db_url, pool_size=1, generic_plans=True)
    try:
        async with scheduler_engine.connect() as conn:
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            leased = await _lease_limited(conn, candidates, {}, "r", 30)
    finally:
        await scheduler_engine.dispose()
    assert [lease["id"] for lease in leased] == [due]
