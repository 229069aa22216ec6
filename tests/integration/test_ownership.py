"""Partition ownership on a real PostgreSQL: fair shares, epochs, claim fencing, trust, release."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections import Counter

import httpx
import pytest
from pydantic import SecretStr
from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.partition import PARTITION_COUNT, fair_share
from app.services.due_listener import DueListener
from app.services.loop import run_forever
from app.services.ownership import PartitionOwnership
from app.services.scheduler import Scheduler
from app.services.scheduler_config import SchedulerConfig
from app.settings import Settings
from app.store.claims import job_claim_due
from app.store.partitions import PartitionEvent
from app.store.tables import jobs, partition_leases, replicas
from tests.conftest import TEST_KEY_RING
from tests.factories import make_jobs, make_tenant_and_target
from tests.receiver import Receiver, wait_for


def ownership(engine: AsyncEngine, replica_id: str) -> PartitionOwnership:
    return PartitionOwnership(engine, replica_id, lease_s=30, renew_s=1)


async def owners(engine: AsyncEngine) -> dict[int, tuple[str | None, int]]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(partition_leases.c.partition, partition_leases.c.owner, partition_leases.c.epoch)
        )
        return {r.partition: (r.owner, r.epoch) for r in rows}


@pytest.mark.parametrize("count", [1, 2, 3, 5, 7, 255, 256, 300])
def test_fair_shares_sum_to_the_partitions_and_differ_by_at_most_one(count: int) -> None:
    members = [f"replica-{i:03}" for i in range(count)]
    shares = [fair_share(m, members) for m in members]
    assert sum(shares) == PARTITION_COUNT
    assert max(shares) - min(shares) <= 1
    # Every replica reaches the same answer whatever order it sees the list in.
    assert shares == [fair_share(m, list(reversed(members))) for m in members]


def test_a_replica_not_yet_in_the_list_counts_itself() -> None:
    # Its own heartbeat may not be visible yet: it still sizes its share for three members.
    assert fair_share("new", ["a", "b"]) == fair_share("new", ["a", "b", "new"]) == 85
    assert fair_share("new", []) == PARTITION_COUNT


async def test_a_lone_replica_takes_every_partition_then_shares_them_when_another_joins(engine: AsyncEngine) -> None:
    a, b = ownership(engine, "a"), ownership(engine, "b")
    assert (await a.run_once()).held == PARTITION_COUNT
    first = await owners(engine)
    assert {owner for owner, _ in first.values()} == {"a"} and {e for _, e in first.values()} == {1}

    # b joins with nothing free; a sheds its surplus on its next round; b then takes it.
    assert (await b.run_once()).held == 0
    assert (await a.run_once()).released == PARTITION_COUNT // 2
    assert (await b.run_once()).acquired == PARTITION_COUNT // 2
    after = await owners(engine)
    assert Counter(owner for owner, _ in after.values()) == {"a": 128, "b": 128}
    for partition, (owner, epoch) in after.items():
        # Moved partitions got a new epoch; kept ones kept theirs. Epochs never go down.
        assert epoch == (2 if owner == "b" else 1), partition
    assert set(a.held()) | set(b.held()) == set(range(PARTITION_COUNT))
    assert not set(a.held()) & set(b.held())


async def test_an_expired_owner_is_replaced_under_a_higher_epoch_and_its_claims_are_fenced(engine: AsyncEngine) -> None:
    tenant, target = await make_tenant_and_target(engine, "http://127.0.0.1:9/never")
    await make_jobs(engine, tenant, target, 20)
    stalled = ownership(engine, "stalled")
    await stalled.run_once()
    stale_view = stalled.held()
    # The stalled replica's leases run out (as if it had been paused) and its heartbeat too.
    async with engine.begin() as conn:
        past = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
        await conn.execute(update(partition_leases).values(expires_at=past))
        await conn.execute(update(replicas).values(expires_at=past))
    heir = ownership(engine, "heir")
    assert (await heir.run_once()).acquired == PARTITION_COUNT
    assert all(epoch == 2 for _, epoch in (await owners(engine)).values())

    # The stale replica still believes its view: the claim statement itself refuses it.
    async with engine.begin() as conn:
        assert await job_claim_due(conn, TEST_KEY_RING, "stalled", 100, 30, stale_view) == []
        claimed = await job_claim_due(conn, TEST_KEY_RING, "heir", 100, 30, heir.held())
    assert len(claimed) == 20
    # And it cannot renew or release what it no longer owns.
    assert (await stalled.run_once()).held == 0
    assert {owner for owner, _ in (await owners(engine)).values()} == {"heir"}


async def test_a_replica_past_its_trust_deadline_claims_nothing_and_posts_nothing(
    engine: AsyncEngine, settings: Settings, receiver: Receiver
) -> None:
    tenant, target = await make_tenant_and_target(engine, receiver.url())
    await make_jobs(engine, tenant, target, 5)
    scheduler = Scheduler(engine, SchedulerConfig.from_settings(settings), TEST_KEY_RING)
    try:
        await scheduler.ownership.run_once()
        held = scheduler.ownership.held()
        async with engine.begin() as conn:
            claimed = await job_claim_due(
                conn, TEST_KEY_RING, scheduler.config.replica_id, 5, scheduler.config.lease_s, held
            )
        # The renewals stopped (a pause, a partition from the database) and the deadline passed.
        scheduler.ownership._trusted_until = time.monotonic() - 0.001
        assert scheduler.ownership.held() == {}
        for job in claimed:
            await scheduler._deliver(job, held[job.partition], time.monotonic())
        assert receiver.requests == []
        async with engine.connect() as conn:
            states = (await conn.execute(select(jobs.c.state, jobs.c.attempt))).all()
        # Handed back untouched: no attempt counted, due again at once.
        assert {(s.value, a) for s, a in states} == {("scheduled", 0)}
    finally:
        await scheduler.close()


async def test_close_releases_partitions_and_leaves_the_cluster(engine: AsyncEngine, settings: Settings) -> None:
    scheduler = Scheduler(engine, SchedulerConfig.from_settings(settings), TEST_KEY_RING)
    await scheduler.run_once()
    assert (await owners(engine))[0][0] == settings.replica_id
    await scheduler.close()
    assert {owner for owner, _ in (await owners(engine)).values()} == {None}
    async with engine.connect() as conn:
        # Gone from the live members (the row stays, expired, so the reaper sees it died).
        assert (await conn.execute(select(replicas).where(replicas.c.expires_at > func.now()))).all() == []
    # Another replica takes everything at once instead of waiting for leases to expire.
    assert (await ownership(engine, "next").run_once()).acquired == PARTITION_COUNT


async def test_cluster_view_needs_the_admin_key_and_shows_replicas_partitions_and_lag(
    engine: AsyncEngine, settings: Settings, client: httpx.AsyncClient, auth: dict[str, str]
) -> None:
    assert (await client.get("/v1/cluster", headers=auth)).status_code == 403  # admin API disabled
    settings.admin_api_key = SecretStr("adm_test_key")
    assert (await client.get("/v1/cluster", headers=auth)).status_code == 403  # a tenant key is not enough
    assert (await client.get("/v1/cluster")).status_code == 401
    admin = {"Authorization": "Bearer adm_test_key"}

    tenant, target = await make_tenant_and_target(engine, "http://127.0.0.1:9/never")
    await make_jobs(engine, tenant, target, 3, due_in_s=-30)
    a, b = ownership(engine, "a"), ownership(engine, "b")
    await a.run_once()
    await b.run_once()
    await a.run_once()
    await b.run_once()
    body = (await client.get("/v1/cluster", headers=admin)).json()
    assert body["partition_count"] == PARTITION_COUNT and body["unowned_partitions"] == []
    by_id = {r["id"]: r for r in body["replicas"]}
    assert set(by_id) == {"a", "b"}
    assert by_id["a"]["partition_count"] == by_id["b"]["partition_count"] == 128
    assert sorted(p["partition"] for r in by_id.values() for p in r["partitions"]) == list(range(PARTITION_COUNT))
    # The three jobs have waited about 30 s: whoever owns them reports that lag.
    assert max(r["lag_s"] for r in by_id.values()) >= 29
    assert "adm_test_key" not in str(body)


def test_a_replica_acts_on_the_others_partition_notices_not_on_its_own() -> None:
    a = PartitionOwnership(None, "a", lease_s=30, renew_s=1)  # type: ignore[arg-type]
    a.on_notice(f"{PartitionEvent.RELEASED} a")
    assert not a.wake.is_set()
    a.on_notice(f"{PartitionEvent.JOINED} b")
    assert a.wake.is_set()
    a.wake.clear()
    # The listener (re)connected: notices may have been missed.
    a.on_notice(None)
    assert a.wake.is_set()


async def test_partitions_change_hands_on_notices_without_waiting_for_a_round(engine: AsyncEngine) -> None:
    """Rounds every 60 s (leases of 180 s): only the notices can move partitions within the
    test's deadline, when a replica joins and when it leaves."""
    stop_a, stop_b = asyncio.Event(), asyncio.Event()
    a = PartitionOwnership(engine, "a", lease_s=180, renew_s=60)
    b = PartitionOwnership(engine, "b", lease_s=180, renew_s=60)

    def run(owner: PartitionOwnership, stop: asyncio.Event) -> list[asyncio.Task[None]]:
        listener = DueListener(engine, lambda _due: None, on_partitions=owner.on_notice)
        return [
            asyncio.create_task(run_forever(owner, stop, logging.getLogger("test"))),
            asyncio.create_task(listener.run(stop)),
        ]

    async def counts() -> Counter[str | None]:
        return Counter(owner for owner, _ in (await owners(engine)).values())

    tasks_a, tasks_b = run(a, stop_a), []
    try:
        await wait_for(lambda: len(a.held()) == PARTITION_COUNT, 20, message="a takes every partition")
        tasks_b = run(b, stop_b)
        await wait_for(lambda: len(b.held()) == PARTITION_COUNT // 2, 20, message="b takes its share at once")
        assert await counts() == {"a": PARTITION_COUNT // 2, "b": PARTITION_COUNT // 2}
        # A clean stop, as the scheduler's: its loops end, then it hands its partitions back.
        stop_b.set()
        await asyncio.gather(*tasks_b)
        await b.release_all()
        await wait_for(lambda: len(a.held()) == PARTITION_COUNT, 20, message="a takes b's share back at once")
        assert await counts() == {"a": PARTITION_COUNT}
    finally:
        stop_a.set()
        stop_b.set()
        await asyncio.gather(*tasks_a, *tasks_b)
