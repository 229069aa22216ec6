"""Faults with real processes and real signals (issue 10): a stalled owner that wakes up POSTs
nothing, and a killed replica's jobs come back as soon as its death is certain, well before
their job lease expires.
"""

from __future__ import annotations

import datetime as dt
import signal
import sys
import time
import uuid

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.services.dispatcher import Dispatcher, PostNotStarted
from app.settings import Settings
from app.store.claims import job_claim_due
from app.store.jobs import db_now
from app.store.tables import jobs, runs
from tests.conftest import TEST_KEY_RING
from tests.e2e.test_cluster import (
    cluster_env,
    count_jobs,
    log_events,
    start_replicas,
    wait_for_fair_shares,
)
from tests.e2e.test_processes import Processes, base_env
from tests.factories import make_jobs, make_jobs_bulk, make_tenant_and_target
from tests.receiver import Receiver, Reply, wait_for

# Replica clusters like tests/e2e/test_cluster.py's: on its xdist worker, one at a time.
pytestmark = pytest.mark.xdist_group("cluster")


async def wait_all_succeeded(engine: AsyncEngine, timeout: float) -> None:
    async def done() -> bool:
        return await count_jobs(engine, jobs.c.state != "succeeded") == 0

    await wait_for(done, timeout=timeout, interval=0.25, message="every job succeeded")


async def test_the_last_trust_check_runs_once_the_connection_is_in_hand_and_sends_nothing_when_it_fails(
    engine: AsyncEngine, settings: Settings, receiver: Receiver
) -> None:
    tenant, target = await make_tenant_and_target(engine, receiver.url())
    await make_jobs(engine, tenant, target, 3)
    async with engine.begin() as conn:
        first, second, third = await job_claim_due(conn, TEST_KEY_RING, "me", 3, 30)
        now = await db_now(conn)
    dispatcher = Dispatcher(4, settings.max_target_timeout_s, settings.egress_policy)
    await dispatcher.start()
    checks: list[str] = []

    def refuse() -> bool:
        checks.append("refused")
        return False

    try:
        # A new connection: connected, then refused before a byte of the request is written.
        with pytest.raises(PostNotStarted):
            await dispatcher.deliver(first, now, refuse)
        assert receiver.requests == [] and checks == ["refused"]
        assert (await dispatcher.deliver(second, now, lambda: True)).succeeded
        # A pooled connection (the one the last POST used): refused just the same.
        with pytest.raises(PostNotStarted):
            await dispatcher.deliver(third, now, refuse)
        assert [r.headers["cronhook-job-id"] for r in receiver.requests] == [str(second.id)]
        assert checks == ["refused", "refused"]
    finally:
        await dispatcher.close()


@pytest.mark.e2e
async def test_a_stopped_scheduler_that_wakes_after_takeover_sends_no_stale_post(
    engine: AsyncEngine, db_url: str, receiver: Receiver, procs: Processes
) -> None:
    receiver.default = Reply(delay_s=1.0)
    tenant, target = await make_tenant_and_target(engine, receiver.url(), timeout_s=3)
    # One tenant, one target: without the fair-share cap, so the sleeper can hold 30 and more.
    env = cluster_env(db_url, CRONHOOK_CONCURRENCY="40", CRONHOOK_BATCH_SIZE="40", CRONHOOK_TENANT_MAX_SHARE="1")
    names = ["sleeper", "s1"]
    started = start_replicas(procs, env, *names)
    procs.start("reaper", ["reaper"], env)
    await wait_for_fair_shares(engine, names)
    await make_jobs_bulk(engine, tenant, target, 600)
    held_by_sleeper = (jobs.c.state == "running", jobs.c.lease_owner == "sleeper")

    async def sleeper_busy() -> bool:
        return await count_jobs(engine, *held_by_sleeper) >= 30

    await wait_for(sleeper_busy, timeout=30, interval=0.05, message="sleeper has deliveries in flight")
    sleeper = started["sleeper"]
    stopped_at = time.time()
    sleeper.send_signal(signal.SIGSTOP)
    try:
        async with engine.connect() as conn:
            in_flight = set((await conn.execute(select(jobs.c.id).where(*held_by_sleeper))).scalars())
        # The survivor takes the partitions over, the reaper rescues the sleeper's jobs (its
        # heartbeat and partition leases expired), and everything is delivered.
        await wait_all_succeeded(engine, timeout=90)
    finally:
        woke_at = time.time()
        sleeper.send_signal(signal.SIGCONT)

    log = procs.log_dir / "sleeper.log"

    def settled() -> set[uuid.UUID]:
        # A POST on the wire at the stop is answered now and its outcome fenced; a claim whose
        # POST had not been written is dropped unsent by the last trust check.
        fenced = {uuid.UUID(e["job_id"]) for e in log_events(log, "lease_fenced")}
        unsent = {uuid.UUID(e["job_id"]) for e in log_events(log, "lease_untrusted_released")}
        return fenced | unsent

    await wait_for(lambda: log_events(log, "event_loop_stalled"), timeout=20, message="the sleeper saw its stall")
    await wait_for(lambda: settled() >= in_flight, timeout=30, message="every stale claim settled")
    # It rejoins through a fresh ownership round.
    await wait_for_fair_shares(engine, names)
    assert await count_jobs(engine, jobs.c.state != "succeeded") == 0
    # Everything was delivered before the wake-up: a request arriving after it is a POST the
    # woken scheduler started on a lease it no longer held, unless its last trust check passed
    # before the stop. The SIGSTOP can land between that check and the write (microseconds, no
    # await between): such an attempt began before the stop and is a POST already under way at
    # the stall, the README's documented repeat. Its delivery log says when it began.
    began = {
        (e["job_id"], e["attempt"]): dt.datetime.fromisoformat(e["ts"]).timestamp() - e["duration_ms"] / 1000
        for e in log_events(log, "delivery")
    }
    late = [
        (r.headers["cronhook-job-id"], int(r.headers["cronhook-attempt"])) for r in receiver.requests if r.at >= woke_at
    ]
    # The stopped process starts nothing for seconds after `stopped_at`: a second's slack is safe.
    stale = [key for key in late if began.get(key, woke_at) > stopped_at + 1.0]
    assert stale == [], f"{len(stale)} stale POSTs after SIGCONT: {late}, began {[began.get(k) for k in late]}"
    assert len({r.headers["cronhook-job-id"] for r in receiver.requests}) == 600


@pytest.mark.e2e
async def test_a_killed_replicas_jobs_are_rescued_once_its_death_is_certain_not_after_the_job_lease(
    engine: AsyncEngine, db_url: str, receiver: Receiver, procs: Processes
) -> None:
    # Default leases and intervals: the promise is about the defaults.
    defaults = Settings()
    receiver.default = Reply(delay_s=1.0)
    target_timeout_s = 5.0
    tenant, target = await make_tenant_and_target(engine, receiver.url(), timeout_s=target_timeout_s)
    # One tenant: without the fair-share cap (half the slots), so the victim holds 50 and more.
    env = base_env(
        CRONHOOK_DATABASE_URL=db_url,
        CRONHOOK_LOG_LEVEL="INFO",
        CRONHOOK_CONCURRENCY="100",
        CRONHOOK_TENANT_MAX_SHARE="1",
    )
    names = ["victim", "s1"]
    started = start_replicas(procs, env, *names)
    procs.start("reaper", ["reaper"], env)
    await wait_for_fair_shares(engine, names, timeout=4 * defaults.partition_lease_s)
    await make_jobs_bulk(engine, tenant, target, 400)
    held_by_victim = (jobs.c.state == "running", jobs.c.lease_owner == "victim")

    async def victim_busy() -> bool:
        return await count_jobs(engine, *held_by_victim) >= 50

    await wait_for(victim_busy, timeout=30, interval=0.05, message="victim has deliveries in flight")
    started["victim"].send_signal(signal.SIGKILL)
    killed = time.monotonic()
    await wait_for(lambda: started["victim"].poll() is not None, timeout=5, message="victim gone")
    async with engine.connect() as conn:
        killed_at = await db_now(conn)
        orphans = set((await conn.execute(select(jobs.c.id).where(*held_by_victim))).scalars())
    assert orphans

    # Its heartbeat expires within a partition lease; its process is gone (no session of it
    # is left), so its death is certain then, without waiting for the target's timeout; the
    # reaper's next pass (its interval, jittered up to 1.2 x) rescues; 5 s of slack for a
    # loaded machine.
    bound_s = defaults.partition_lease_s + 1.2 * defaults.reaper_interval_s + 5
    assert bound_s < defaults.partition_lease_s + target_timeout_s + defaults.lease_margin_s + 5
    assert bound_s < defaults.lease_s, "the promise would be no better than the job lease"

    async def rescued() -> bool:
        return await count_jobs(engine, *held_by_victim) == 0

    await wait_for(rescued, timeout=defaults.lease_s + 30, interval=0.2, message="victim's jobs rescued")
    rescued_after_s = time.monotonic() - killed
    await wait_all_succeeded(engine, timeout=defaults.lease_s)
    settled_after_s = time.monotonic() - killed
    sys.stdout.write(f"\nsigkill_to_rescued_s={rescued_after_s:.1f} sigkill_to_settled_s={settled_after_s:.1f}\n")
    async with engine.connect() as conn:
        reaped = list(
            await conn.execute(
                select(runs.c.job_id, runs.c.finished_at, runs.c.error).where(runs.c.outcome == "lease_expired")
            )
        )
    assert {r.job_id for r in reaped} == orphans and len(reaped) == len(orphans)
    # Rescued because the replica died, not because the 60 s job lease ran out.
    assert all("died" in (r.error or "") for r in reaped)
    late = [r for r in reaped if (r.finished_at - killed_at).total_seconds() > bound_s]
    assert not late, f"{len(late)} rescued later than {bound_s:g}s after the kill"
    assert len({r.headers["cronhook-job-id"] for r in receiver.requests}) == 400
