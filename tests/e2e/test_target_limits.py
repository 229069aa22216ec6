"""Per-target delivery limits, enforced across two scheduler replicas through PostgreSQL."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.egress import parse_egress_allow
from app.services.scheduler import Scheduler
from app.services.scheduler_config import SchedulerConfig
from app.store.tables import jobs, targets
from tests.conftest import LOOPBACK_ALLOWED, TEST_KEY_RING, make_job, make_target
from tests.factories import make_jobs_bulk
from tests.receiver import Receiver, Reply, wait_for


@pytest.fixture
async def two_replicas(engine: AsyncEngine) -> AsyncIterator[list[Scheduler]]:
    replicas = [
        Scheduler(
            engine,
            SchedulerConfig(
                replica_id=f"replica-{i}",
                # Smaller than the burst, so a claim that let a saturated target's older jobs
                # fill the batch would hold every other target back.
                batch_size=10,
                poll_interval_s=0.05,
                lease_s=10,
                max_target_timeout_s=3,
                lease_margin_s=1,
                partition_lease_s=1.5,
                partition_renew_s=0.25,
                egress=parse_egress_allow(LOOPBACK_ALLOWED),
            ),
            TEST_KEY_RING,
        )
        for i in (1, 2)
    ]
    stop = asyncio.Event()
    tasks = [asyncio.create_task(r.run_forever(stop)) for r in replicas]

    async def split() -> bool:
        return all(len(r.ownership.held()) == 128 for r in replicas)

    try:
        await wait_for(split, timeout=60, message="two replicas share the partitions")
        yield replicas
    finally:
        stop.set()
        await asyncio.gather(*tasks)
        for replica in replicas:
            await replica.close(grace_s=5)


async def test_max_in_flight_holds_across_replicas_and_other_targets_are_not_delayed(
    client: httpx.AsyncClient,
    auth: dict[str, str],
    receiver: Receiver,
    engine: AsyncEngine,
    two_replicas: list[Scheduler],
) -> None:
    receiver.default = Reply(delay_s=0.3)
    limited = await make_target(client, auth, receiver.url("/limited"))
    patched = await client.patch(f"/v1/targets/{limited['id']}", json={"max_in_flight": 3}, headers=auth)
    assert patched.status_code == 200 and patched.json()["max_in_flight"] == 3
    free = await make_target(client, auth, receiver.url("/free"))
    # A burst to the limited target first (60 deliveries of 0.3 s, 3 at a time, about 6 s),
    # then the free target's, all written at once: how long creating them took cannot decide
    # how many limited deliveries went first.
    async with engine.connect() as conn:
        tenant = await conn.scalar(select(targets.c.tenant_id).where(targets.c.id == uuid.UUID(limited["id"])))
    assert tenant is not None
    await make_jobs_bulk(engine, tenant, uuid.UUID(limited["id"]), 60, due_in_s=-2.0)
    await make_jobs_bulk(engine, tenant, uuid.UUID(free["id"]), 30, due_in_s=-1.0)

    # About 6 s of work (60 x 0.3 s, 3 at a time); the deadline only catches a stuck limit.
    await wait_for(lambda: len(receiver.requests) == 90, timeout=90, message="all 90 delivered")
    # Both replicas delivered to the limited target, yet never more than 3 at once.
    assert receiver.max_in_flight["/limited"] <= 3
    assert receiver.max_in_flight["/free"] > 3
    assert len({r.headers["cronhook-job-id"] for r in receiver.requests if r.path == "/limited"}) == 60
    # The free target's jobs went straight through, past the limited target's backlog.
    # Judged by order, not by seconds: had the limited target's older jobs filled the claims,
    # the free target's would have waited until fewer than a batch (10) of them were left
    # unclaimed, so at least 60 - 10 - 3 (claimed, not yet arrived) would have gone first.
    free_done = max(r.at for r in receiver.requests if r.path == "/free")
    limited_before = sum(1 for r in receiver.requests if r.path == "/limited" and r.at <= free_done)
    assert limited_before < 60 - 10 - 3, f"{limited_before} of 60 limited deliveries went before the free target"


async def test_rate_per_s_is_a_token_bucket_shared_by_the_replicas(
    client: httpx.AsyncClient,
    auth: dict[str, str],
    receiver: Receiver,
    engine: AsyncEngine,
    two_replicas: list[Scheduler],
) -> None:
    rate, burst = 5.0, 5  # the bucket holds one second's worth
    target = await make_target(client, auth, receiver.url("/rated"))
    await client.patch(f"/v1/targets/{target['id']}", json={"rate_per_s": rate}, headers=auth)
    for _ in range(25):
        await make_job(client, auth, target["id"])

    await wait_for(lambda: len(receiver.requests) == 25, timeout=60, message="all 25 delivered")
    # The limit is on claims, on the database's clock: each job's first claim time.
    async with engine.connect() as conn:
        claimed = sorted(
            (
                await conn.execute(
                    select(jobs.c.occurrence_claimed_at).where(jobs.c.target_id == uuid.UUID(target["id"]))
                )
            ).scalars()
        )
    assert len(claimed) == 25 and None not in claimed
    # A token bucket: within any span of T seconds at most burst + rate * T claims, exactly.
    for i, first in enumerate(claimed):
        for j in range(i, len(claimed)):
            span = (claimed[j] - first).total_seconds()
            assert j - i + 1 <= burst + rate * span + 1e-6, f"{j - i + 1} claims within {span:.3f}s"
    # So the 20 after the first burst took at least 4 s, and the replicas shared one bucket.
    assert (claimed[-1] - claimed[0]).total_seconds() >= (25 - burst) / rate - 1e-6
    assert len({r.headers["cronhook-job-id"] for r in receiver.requests}) == 25
