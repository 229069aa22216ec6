"""A database that stops committing (a synchronous standby gone: every commit waits for it;
a full WAL disk or a frozen volume look the same) under a running `cronhook scheduler`: the
process says so within seconds, naming the operation and what the server says it waits for;
its /readyz answers 503 while it lasts and 200 after; nothing is lost or delivered twice, and
nothing needs a restart. The test owns its server (its own embedded instance)."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from app.db.engine import create_engine, normalize_url
from app.db.migrate import migrate_to_head
from app.metrics import sample_value
from app.store.tables import jobs
from tests.e2e.test_database_restart import own_server  # noqa: F401  (fixture)
from tests.e2e.test_processes import Processes, base_env, free_port
from tests.factories import make_jobs, make_tenant_and_target
from tests.receiver import Receiver, wait_for

# The database drills stop, stall and fail over servers under live processes and time
# what they log: one at a time on one xdist worker, so two drills never starve each other
# of the two cores (their deadlines assume a drill has the box to itself, as it did serially).
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("database-drills")]


async def set_synchronous_standby(url: str, names: str | None) -> None:
    """ALTER SYSTEM writes a file, not WAL: it works while commits hang."""
    engine = create_async_engine(normalize_url(url), isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            if names is None:
                await conn.execute(text("ALTER SYSTEM RESET synchronous_standby_names"))
            else:
                await conn.execute(text(f"ALTER SYSTEM SET synchronous_standby_names = '{names}'"))
            await conn.execute(text("SELECT pg_reload_conf()"))
    finally:
        await engine.dispose()


def events(log: str, name: str) -> list[dict[str, Any]]:
    found = []
    for line in log.splitlines():
        if line.startswith("{") and f'"{name}"' in line:
            found.append(json.loads(line))
    return [event for event in found if event.get("event") == name]


async def readyz(http: httpx.AsyncClient) -> int:
    try:
        return (await http.get("/readyz")).status_code
    except httpx.TransportError:
        return 0


async def test_a_commit_stall_is_reported_and_readiness_follows_it(
    own_server: Any,  # noqa: F811
    receiver: Receiver,
    procs: Processes,
) -> None:
    url = own_server.get_uri(driver="asyncpg")
    engine = create_engine(url, pool_size=2)
    await migrate_to_head(engine)
    tenant, target = await make_tenant_and_target(engine, receiver.url())
    port = free_port()
    env = base_env(
        CRONHOOK_DATABASE_URL=url,
        CRONHOOK_POLL_INTERVAL_S="0.1",
        CRONHOOK_DB_STALL_WARN_S="1",
        CRONHOOK_METRICS_PORT=str(port),
        CRONHOOK_LOG_FORMAT="json",
    )
    scheduler = procs.start("scheduler", ["scheduler"], env)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:

            async def ready() -> bool:
                return await readyz(http) == 200

            await wait_for(ready, timeout=60, interval=0.1, message="scheduler ready")
            await make_jobs(engine, tenant, target, 30)
            await wait_for(lambda: len(receiver.requests) >= 30, timeout=60, message="first 30 delivered")
            # These fall due during the stall: their claim is a commit that hangs.
            await make_jobs(engine, tenant, target, 30, due_in_s=2)
            await set_synchronous_standby(url, "ghost_standby")

            async def not_ready() -> bool:
                return await readyz(http) == 503

            await wait_for(lambda: events(procs.log("scheduler"), "database_stalled"), timeout=30, message="warned")
            (first, *_) = events(procs.log("scheduler"), "database_stalled")
            assert first["level"] == "warning" and first["role"] == "scheduler"
            assert first["operation"] in {"claim", "ownership_round", "commit_probe", "outcome_batch"}
            # What the server says the stalled session waits for: the synchronous standby.
            assert any("SyncRep" in wait for wait in first["waits"]), first
            await wait_for(not_ready, timeout=30, interval=0.2, message="readiness fails during the stall")
            body = (await http.get("/readyz")).json()
            assert "no database commit has completed" in body["reason"]
            # Alive: no reason to restart it.
            assert [(await http.get(probe)).status_code for probe in ("/healthz", "/livez")] == [200, 200]
            exposition = (await http.get("/metrics")).text
            assert sample_value(exposition, "cronhook_db_oldest_operation_seconds", {"role": "scheduler"}) >= 1
            # The warning repeats with backoff while it lasts, not once per second.
            await wait_for(lambda: len(events(procs.log("scheduler"), "database_stalled")) >= 2, timeout=30)
            assert len(events(procs.log("scheduler"), "database_stalled")) <= 4

            await set_synchronous_standby(url, None)
            await wait_for(lambda: events(procs.log("scheduler"), "database_stall_cleared"), timeout=30)
            await wait_for(ready, timeout=30, interval=0.2, message="ready again")

            async def all_succeeded() -> bool:
                async with engine.connect() as conn:
                    left = await conn.scalar(select(func.count()).where(jobs.c.state != "succeeded"))
                return left == 0

            await wait_for(all_succeeded, timeout=60, interval=0.25, message="all delivered after the stall")
            ids = Counter(receiver.webhook_ids())
            assert len(ids) == 60 and set(ids.values()) == {1}, ids.most_common(3)
            assert scheduler.poll() is None  # rode it out, no restart
    finally:
        await set_synchronous_standby(url, None)
        await engine.dispose()
