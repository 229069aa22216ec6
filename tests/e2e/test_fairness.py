"""Fairness between tenants and targets, with real receivers on 127.0.0.1: receivers that
hang hold at most their tenant's share of a scheduler's delivery slots (a real `cronhook
scheduler` process with default settings) and at most the default per-target cap."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.egress import parse_egress_allow
from app.services.scheduler import Scheduler
from app.services.scheduler_config import SchedulerConfig
from app.settings import default_of
from app.store.targets import target_create
from tests.conftest import LOOPBACK_ALLOWED, TEST_KEY_RING
from tests.e2e.test_processes import Processes, base_env
from tests.factories import make_jobs, make_tenant_and_target
from tests.receiver import Receiver, Reply, wait_for


def arrived(receiver: Receiver, path: str) -> int:
    return sum(1 for request in receiver.requests if request.path == path)


async def add_target(engine: AsyncEngine, tenant_id: uuid.UUID, url: str, timeout_s: float) -> uuid.UUID:
    async with engine.begin() as conn:
        row, _ = await target_create(conn, TEST_KEY_RING, tenant_id, "t", url, {}, timeout_s)
    target_id: uuid.UUID = row["id"]
    return target_id


@pytest.fixture
def hang(receiver: Receiver) -> asyncio.Event:
    """Requests to /noisy and /capped hang until this is set (at the latest at teardown)."""
    release = asyncio.Event()
    receiver.by_path["/noisy"] = receiver.by_path["/capped"] = Reply(hold=release)
    return release


@pytest.mark.e2e
async def test_a_tenant_whose_receivers_hang_leaves_the_other_tenants_jobs_on_time(
    engine: AsyncEngine, db_url: str, receiver: Receiver, hang: asyncio.Event, procs: Processes
) -> None:
    share = int(default_of("concurrency") * default_of("tenant_max_share"))  # 100 of 200 slots
    noisy, _ = await make_tenant_and_target(engine, receiver.url("/unused"))
    # 250 jobs over five targets: no target reaches the default per-target cap (100); the
    # tenant share binds.
    for n in range(5):
        target = await add_target(engine, noisy, receiver.url(f"/noisy?target={n}"), timeout_s=30)
        await make_jobs(engine, noisy, target, 50, due_in_s=-1)
    quiet, quiet_target = await make_tenant_and_target(engine, receiver.url("/quiet"))
    procs.start("scheduler", ["scheduler"], base_env(CRONHOOK_DATABASE_URL=db_url))
    try:
        await wait_for(
            lambda: receiver.in_flight.get("/noisy", 0) == share, timeout=30, message="noisy tenant at its share"
        )
        await make_jobs(engine, quiet, quiet_target, 20, due_in_s=0.2)
        await wait_for(lambda: arrived(receiver, "/quiet") == 20, timeout=20, message="the quiet tenant's jobs")
        # All of them while the noisy tenant's first deliveries still hang, none answered,
        # and it never held more than its share.
        assert receiver.in_flight["/noisy"] == share
        assert arrived(receiver, "/noisy") == share
    finally:
        hang.set()
    await wait_for(lambda: arrived(receiver, "/noisy") == 250, timeout=30, message="the noisy jobs, once answered")
    assert receiver.max_in_flight["/noisy"] == share


@pytest.fixture
async def capped_scheduler(engine: AsyncEngine) -> AsyncIterator[Scheduler]:
    config = SchedulerConfig(
        replica_id="capped",
        concurrency=20,
        target_default_max_in_flight=3,
        poll_interval_s=0.05,
        lease_s=10,
        max_target_timeout_s=5,
        lease_margin_s=1,
        egress=parse_egress_allow(LOOPBACK_ALLOWED),
    )
    scheduler = Scheduler(engine, config, TEST_KEY_RING)
    stop = asyncio.Event()
    task = asyncio.create_task(scheduler.run_forever(stop))
    try:
        yield scheduler
    finally:
        stop.set()
        await task
        await scheduler.close(grace_s=5)


async def test_a_target_without_max_in_flight_gets_at_most_the_default_cap_and_the_rest_wait_their_turn(
    engine: AsyncEngine, receiver: Receiver, hang: asyncio.Event, capped_scheduler: Scheduler
) -> None:
    tenant, capped = await make_tenant_and_target(engine, receiver.url("/capped"), timeout_s=5)
    other = await add_target(engine, tenant, receiver.url("/other"), timeout_s=5)
    await make_jobs(engine, tenant, capped, 10, due_in_s=-1)
    await make_jobs(engine, tenant, other, 5, due_in_s=-0.5)
    try:
        await wait_for(lambda: arrived(receiver, "/other") == 5, timeout=20, message="the other target's jobs")
        assert receiver.in_flight["/capped"] == 3 and arrived(receiver, "/capped") == 3
    finally:
        hang.set()
    # The waiting jobs go as the slots free up, never more than three at once.
    await wait_for(lambda: arrived(receiver, "/capped") == 10, timeout=20, message="the capped target's jobs")
    assert receiver.max_in_flight["/capped"] == 3
