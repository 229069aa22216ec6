"""A scheduler process SIGKILLed while a hundred async attempts are open (app/domain/
completion.py): an open attempt belongs to no replica (lease owner ASYNC_OWNER), so neither
the crash, nor the replica that takes over, nor the reaper's rescue of a dead replica's jobs
touches it; every receiver can still report, and nothing is delivered twice."""

from __future__ import annotations

import signal
import uuid
from collections import Counter
from urllib.parse import urlsplit

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.completion import ASYNC_OWNER
from app.services.reaper import Reaper, ReaperConfig
from app.store.tables import jobs, replicas, runs
from tests.conftest import TEST_KEY_RING, make_job, make_target
from tests.e2e.test_cluster import cluster_env, count_jobs, start_replicas, wait_for_fair_shares
from tests.e2e.test_processes import Processes
from tests.receiver import Receiver, Reply, wait_for

# Replica processes like tests/e2e/test_cluster.py's: on its xdist worker, one at a time.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300), pytest.mark.xdist_group("cluster")]

JOBS = 100


async def test_a_killed_scheduler_leaves_open_attempts_open_and_each_job_finishes_once(
    client: httpx.AsyncClient,
    auth: dict[str, str],
    receiver: Receiver,
    engine: AsyncEngine,
    db_url: str,
    procs: Processes,
) -> None:
    receiver.by_path["/async"] = Reply(status=202, body=b"")
    target = await make_target(client, auth, receiver.url("/async"), completion="async", heartbeat_timeout_s=600)
    sync_target = await make_target(client, auth, receiver.url("/sync"))
    env = cluster_env(db_url)
    victim = start_replicas(procs, env, "victim")["victim"]
    await wait_for_fair_shares(engine, ["victim"])
    ids = {(await make_job(client, auth, target["id"]))["id"] for _ in range(JOBS)}
    open_attempts = (jobs.c.state == "running", jobs.c.lease_owner == ASYNC_OWNER)

    async def all_open() -> bool:
        return await count_jobs(engine, *open_attempts) == JOBS

    await wait_for(all_open, timeout=90, interval=0.1, message="every delivery answered 202 and left open")
    victim.send_signal(signal.SIGKILL)
    assert victim.wait(timeout=10) == -signal.SIGKILL
    assert len(receiver.requests) == JOBS

    # Another replica takes the dead one's partitions over, and is delivering (a sync job).
    start_replicas(procs, env, "survivor")
    await wait_for_fair_shares(engine, ["survivor"])
    probe = await make_job(client, auth, sync_target["id"])

    async def probe_delivered() -> bool:
        shown = (await client.get(f"/v1/jobs/{probe['id']}", headers=auth)).json()
        return bool(shown["state"] == "succeeded")

    await wait_for(probe_delivered, timeout=60, interval=0.1, message="the survivor delivers")

    async def victim_expired() -> bool:
        async with engine.connect() as conn:
            expired = await conn.scalar(select(replicas.c.expires_at < func.now()).where(replicas.c.id == "victim"))
        return bool(expired)

    await wait_for(victim_expired, timeout=60, interval=0.2, message="the victim's heartbeat expired")
    # The victim's death is certain now (its heartbeat and partition leases expired, its
    # sessions gone), yet a rescue pass finds nothing of its open attempts to take.
    rescue = await Reaper(engine, ReaperConfig(dead_replica_fast_rescue=True), TEST_KEY_RING).run_once()
    assert (rescue.rescued, rescue.dead_lettered) == (0, 0)
    assert await count_jobs(engine, *open_attempts) == JOBS

    # Every receiver reports, through the API, on the URL its delivery carried.
    deliveries = [r for r in receiver.requests if r.path == "/async"]
    assert len(deliveries) == JOBS
    for delivery in deliveries:
        path = urlsplit(delivery.headers["cronhook-completion-url"]).path
        answer = await client.post(
            path, json={"outcome": "succeeded", "result": {"job": delivery.headers["cronhook-job-id"]}}
        )
        assert answer.status_code == 204, answer.text

    job_ids = [uuid.UUID(job_id) for job_id in ids]
    assert await count_jobs(engine, jobs.c.id.in_(job_ids), jobs.c.state != "succeeded") == 0
    deliveries = [r for r in receiver.requests if r.path == "/async"]
    assert len(deliveries) == JOBS
    assert len(set(receiver.webhook_ids())) == len(receiver.requests) == JOBS + 1
    assert {r.headers["cronhook-job-id"] for r in deliveries} == ids
    async with engine.connect() as conn:
        rows = (
            await conn.execute(select(runs.c.job_id, runs.c.outcome, runs.c.result).where(runs.c.job_id.in_(job_ids)))
        ).all()
    assert Counter(str(row.job_id) for row in rows) == Counter(dict.fromkeys(ids, 1))
    assert all(row.outcome == "success" and row.result == {"job": str(row.job_id)} for row in rows)
