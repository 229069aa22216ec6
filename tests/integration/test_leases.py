"""Claiming, fencing and reaping against a real database, with concurrent actors."""

from __future__ import annotations

import asyncio
import datetime as dt
import random
from collections import Counter

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.job import AttemptOutcome, FinishedAttempt, RunOutcome
from app.domain.lifecycle import after_attempt
from app.services.reaper import Reaper, ReaperConfig, ReaperPass, RetentionPass
from app.store.claims import job_claim_batch, job_claim_due
from app.store.lease_writes import job_release_claim, job_release_unanswered_claim
from app.store.outcomes import job_finish_attempts
from app.store.tables import dead_letters, jobs, runs
from app.store.targets import target_get_signing_secret, target_rotate_secret, target_update
from tests.conftest import TEST_KEY_RING
from tests.factories import expire_leases, make_jobs, make_tenant_and_target

NOTHING_RETAINED = RetentionPass(dead_letters_deleted=0, runs_deleted=0, jobs_deleted=0)


async def states(engine: AsyncEngine) -> Counter[str]:
    async with engine.connect() as conn:
        rows = (await conn.execute(select(jobs.c.state, func.count()).group_by(jobs.c.state))).all()
    return Counter({state.value: n for state, n in rows})


async def test_concurrent_claims_are_disjoint_and_skip_future_jobs(engine: AsyncEngine) -> None:
    tenant, target = await make_tenant_and_target(engine, "http://127.0.0.1:9/")
    due = await make_jobs(engine, tenant, target, 60)
    await make_jobs(engine, tenant, target, 5, due_in_s=3600)

    async def claim(owner: str) -> list[str]:
        async with engine.begin() as conn:
            return [str(j.id) for j in await job_claim_due(conn, TEST_KEY_RING, owner, 25, 30)]

    batches = await asyncio.gather(*(claim(f"replica-{i}") for i in range(4)))
    claimed = [job_id for batch in batches for job_id in batch]
    assert len(claimed) == len(set(claimed)) == 60
    assert set(claimed) == {str(i) for i in due}
    assert (await states(engine)) == Counter({"running": 60, "scheduled": 5})


async def test_a_claim_ahead_takes_jobs_due_within_its_horizon_and_says_when_the_rest_are(
    engine: AsyncEngine,
) -> None:
    """What the scheduler's claim_ahead_s rests on: jobs due within `ahead_s` are leased with
    the due time they must wait for, later ones are left, and the next-due time the claim
    reports is beyond the horizon (else an idle scheduler would wake for jobs it has)."""
    tenant, target = await make_tenant_and_target(engine, "http://127.0.0.1:9/")
    soon = set(await make_jobs(engine, tenant, target, 3, due_in_s=20))
    later = await make_jobs(engine, tenant, target, 2, due_in_s=120)
    async with engine.connect() as conn:
        await conn.execution_options(isolation_level="AUTOCOMMIT")
        batch = await job_claim_batch(conn, TEST_KEY_RING, "replica-a", 10, 300, ahead_s=60)
    assert {job.id for job in batch.jobs} == soon
    for job in batch.jobs:
        assert job.due_at is not None and (job.due_at - job.claimed_at).total_seconds() > 15
    async with engine.connect() as conn:
        later_run_at = await conn.scalar(select(func.min(jobs.c.run_at)).where(jobs.c.id.in_(later)))
    assert batch.next_due_at == later_run_at
    assert (await states(engine)) == Counter({"running": 3, "scheduled": 2})


async def test_a_lost_claim_answer_hands_its_jobs_back_not_before_they_were_due(engine: AsyncEngine) -> None:
    """A claim whose answer was lost (the connection died around its commit) is handed back
    on the next pass; its jobs may have been claimed ahead of their due time, which the lease
    cleared, so they wait again at least until the claim's time plus the claim-ahead: a later
    claim must not POST them early."""
    tenant, target = await make_tenant_and_target(engine, "http://127.0.0.1:9/")
    (job_id,) = await make_jobs(engine, tenant, target, 1, due_in_s=20)
    async with engine.connect() as conn:
        due = await conn.scalar(select(jobs.c.run_at).where(jobs.c.id == job_id))
        answered_before: dt.datetime = (await conn.execute(select(func.now()))).scalar_one()
    async with engine.connect() as conn:
        await conn.execution_options(isolation_level="AUTOCOMMIT")
        (claimed,) = (await job_claim_batch(conn, TEST_KEY_RING, "replica-a", 10, 300, ahead_s=60)).jobs
    async with engine.begin() as conn:
        released = await job_release_unanswered_claim(conn, "replica-a", answered_before, 300, [], ahead_s=60)
    assert released == 1
    async with engine.connect() as conn:
        row = (await conn.execute(select(jobs.c.state, jobs.c.run_at, jobs.c.attempt).where(jobs.c.id == job_id))).one()
    assert row.state.value == "scheduled" and row.attempt == 0
    assert row.run_at >= due
    assert row.run_at >= claimed.claimed_at + dt.timedelta(seconds=60)


async def test_a_stale_lease_cannot_record_an_outcome(engine: AsyncEngine) -> None:
    tenant, target = await make_tenant_and_target(engine, "http://127.0.0.1:9/")
    await make_jobs(engine, tenant, target, 1, max_attempts=3)
    async with engine.begin() as conn:
        (first,) = await job_claim_due(conn, TEST_KEY_RING, "slow-replica", 10, 30)
    # The slow replica's lease expires; the reaper hands the job back and another claims it.
    await expire_leases(engine)
    assert await Reaper(engine, ReaperConfig(), TEST_KEY_RING).run_once() == ReaperPass(
        rescued=1, dead_lettered=0, idempotency_keys_purged=0, retention=NOTHING_RETAINED
    )
    async with engine.begin() as conn:
        await conn.execute(jobs.update().values(run_at=func.now()).where(jobs.c.state == "retrying"))
        (second,) = await job_claim_due(conn, TEST_KEY_RING, "fast-replica", 10, 30)
    assert second.attempt == 2 and second.lease_token != first.lease_token

    success = AttemptOutcome(RunOutcome.SUCCESS, 200)
    step = after_attempt(first.attempt_context(), True, first.claimed_at, random.Random(1))
    async with engine.begin() as conn:
        assert await job_finish_attempts(conn, [FinishedAttempt(first, success, step)]) == set()  # fenced
    async with engine.begin() as conn:
        assert await job_finish_attempts(conn, [FinishedAttempt(second, success, step)]) == {
            (second.id, second.lease_token)
        }
    assert (await states(engine)) == Counter({"succeeded": 1})
    async with engine.connect() as conn:
        outcomes = (await conn.execute(select(runs.c.attempt, runs.c.outcome).order_by(runs.c.id))).all()
    assert [tuple(r) for r in outcomes] == [(1, "lease_expired"), (2, "success")]


async def test_two_reapers_handle_each_expired_lease_exactly_once(engine: AsyncEngine) -> None:
    tenant, target = await make_tenant_and_target(engine, "http://127.0.0.1:9/")
    retryable = await make_jobs(engine, tenant, target, 150, max_attempts=3)
    exhausted = await make_jobs(engine, tenant, target, 50, max_attempts=1)
    async with engine.begin() as conn:
        assert len(await job_claim_due(conn, TEST_KEY_RING, "doomed", 500, 30)) == 200
    await expire_leases(engine)

    reapers = [Reaper(engine, ReaperConfig(batch_size=40), TEST_KEY_RING) for _ in range(2)]
    totals: Counter[str] = Counter()
    while True:
        results = await asyncio.gather(*(r.run_once() for r in reapers))
        for result in results:
            totals.update(rescued=result.rescued, dead_lettered=result.dead_lettered)
        if all(result == ReaperPass(0, 0, 0, NOTHING_RETAINED) for result in results):
            break
    assert totals == Counter({"rescued": 150, "dead_lettered": 50})
    assert (await states(engine)) == Counter({"retrying": 150, "dead": 50})
    async with engine.connect() as conn:
        per_job = Counter((await conn.execute(select(runs.c.job_id))).scalars().all())
        letters = (await conn.execute(select(dead_letters.c.job_id))).scalars().all()
    assert set(per_job.values()) == {1} and len(per_job) == 200
    assert sorted(letters) == sorted(exhausted)
    assert not set(letters) & set(retryable)


async def test_reaper_leaves_live_leases_alone(engine: AsyncEngine) -> None:
    tenant, target = await make_tenant_and_target(engine, "http://127.0.0.1:9/")
    await make_jobs(engine, tenant, target, 3)
    async with engine.begin() as conn:
        await job_claim_due(conn, TEST_KEY_RING, "alive", 10, 30)
    assert await Reaper(engine, ReaperConfig(), TEST_KEY_RING).run_once() == ReaperPass(0, 0, 0, NOTHING_RETAINED)
    assert (await states(engine)) == Counter({"running": 3})


async def test_a_stale_and_a_current_outcome_in_one_batch_write_one_run(engine: AsyncEngine) -> None:
    tenant, target = await make_tenant_and_target(engine, "http://127.0.0.1:9/")
    await make_jobs(engine, tenant, target, 1, max_attempts=3)
    async with engine.begin() as conn:
        (stale,) = await job_claim_due(conn, TEST_KEY_RING, "stalled", 10, 30)
    await expire_leases(engine)
    await Reaper(engine, ReaperConfig(), TEST_KEY_RING).run_once()
    async with engine.begin() as conn:
        await conn.execute(jobs.update().values(run_at=func.now()).where(jobs.c.state == "retrying"))
        (current,) = await job_claim_due(conn, TEST_KEY_RING, "live", 10, 30)
    success = AttemptOutcome(RunOutcome.SUCCESS, 200)
    items = [
        FinishedAttempt(job, success, after_attempt(job.attempt_context(), True, job.claimed_at, random.Random(1)))
        for job in (stale, current, current)  # the current one handed over twice, too
    ]
    async with engine.begin() as conn:
        assert await job_finish_attempts(conn, items) == {(current.id, current.lease_token)}
    async with engine.connect() as conn:
        outcomes = (await conn.execute(select(runs.c.outcome).order_by(runs.c.id))).scalars().all()
    assert outcomes == ["lease_expired", "success"]


async def test_releasing_a_claim_gives_the_attempt_back(engine: AsyncEngine) -> None:
    tenant, target = await make_tenant_and_target(engine, "http://127.0.0.1:9/")
    (job_id,) = await make_jobs(engine, tenant, target, 1, max_attempts=1)
    for _ in range(2):  # released twice, still claimable with its single attempt
        async with engine.begin() as conn:
            (claimed,) = await job_claim_due(conn, TEST_KEY_RING, "stalled", 10, 30)
            assert claimed.attempt == 1
            assert await job_release_claim(conn, claimed) is True
            assert await job_release_claim(conn, claimed) is False  # already released
    async with engine.connect() as conn:
        row = (await conn.execute(select(jobs).where(jobs.c.id == job_id))).mappings().one()
    assert row["state"].value == "scheduled" and row["attempt"] == 0 and row["run_at"] is not None
    assert row["lease_token"] is None


async def test_a_claimed_job_carries_its_targets_settings_as_they_are_at_the_claim(engine: AsyncEngine) -> None:
    """The target's part of a claimed job is opened once per target version and shared: an
    edit or a rotation between two claims must reach the second one, every job of one claim
    must carry the same settings, and the secrets come back opened (never sealed)."""
    tenant, target = await make_tenant_and_target(engine, "http://127.0.0.1:9/a")
    await make_jobs(engine, tenant, target, 2)
    async with engine.begin() as conn:
        first = await job_claim_due(conn, TEST_KEY_RING, "r1", 10, 30)
        secret = await target_get_signing_secret(conn, TEST_KEY_RING, tenant, target)
    assert [(j.url, j.headers, j.retry_on_status, j.signing_secret) for j in first] == [
        ("http://127.0.0.1:9/a", {}, None, secret)
    ] * 2
    async with engine.begin() as conn:
        changes = {"url": "http://127.0.0.1:9/b", "headers": {"X-Team": "blue"}, "retry_on_status": [418]}
        await target_update(conn, TEST_KEY_RING, tenant, target, changes)
        new_secret = await target_rotate_secret(conn, TEST_KEY_RING, tenant, target, grace_s=60)
    await make_jobs(engine, tenant, target, 1)
    async with engine.begin() as conn:
        (second,) = await job_claim_due(conn, TEST_KEY_RING, "r1", 10, 30)
    expected = ("http://127.0.0.1:9/b", {"X-Team": "blue"}, frozenset({418}))
    assert (second.url, second.headers, second.retry_on_status) == expected
    assert (second.signing_secret, second.previous_signing_secret) == (new_secret, secret)
