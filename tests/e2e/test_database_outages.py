"""PostgreSQL failure modes under a real `cronhook up` process (API, scheduler and reaper): the
database refusing connections (a role's CONNECTION LIMIT reached: SQLSTATE 53300, the same
refusal as max_connections) and a statement timeout on the claim. The services back off,
log once per outage, /readyz says why, and everything resumes without operator action.

The outage lasts CRONHOOK_TEST_OUTAGE_S seconds (default 6; the issue's figure is 30).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store.tables import jobs
from tests.conftest import admin_execute
from tests.e2e.test_cluster import cluster_env, count_jobs
from tests.e2e.test_processes import Processes, free_port, wait_until_ready
from tests.factories import make_jobs, make_tenant_and_target
from tests.receiver import Receiver, wait_for

OUTAGE_S = float(os.environ.get("CRONHOOK_TEST_OUTAGE_S", "6"))
# Long enough that a claim on a busy two-core machine (four test workers, each with its own
# server) does not time out on its own; short enough that part 2 is quick.
STATEMENT_TIMEOUT_S = 2


@pytest.fixture
async def limited_role(pg_server_url: str, db_url: str) -> AsyncIterator[tuple[str, str]]:
    """A plain login role (CONNECTION LIMIT binds it; a superuser is exempt) with the rights
    cronhook needs in the test database; returns (role, its database URL)."""
    role = f"cronhook_{uuid.uuid4().hex[:10]}"
    await admin_execute(pg_server_url, f'CREATE ROLE "{role}" LOGIN')
    await admin_execute(
        db_url,
        f'GRANT ALL ON SCHEMA public TO "{role}"',
        f'GRANT ALL ON ALL TABLES IN SCHEMA public TO "{role}"',
        f'GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO "{role}"',
    )
    url = make_url(db_url).set(username=role, password=None).render_as_string(hide_password=False)
    try:
        yield role, url
    finally:
        await admin_execute(db_url, f'DROP OWNED BY "{role}"')
        await admin_execute(
            pg_server_url,
            f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'",
        )
        await admin_execute(pg_server_url, f'DROP ROLE IF EXISTS "{role}"')


def lines_so_far(log: Path) -> int:
    """Where the log is now: events(..., since=) reads only what came after."""
    return len(log.read_text().splitlines())


def events(log: Path, name: str, since: int = 0) -> list[dict[str, Any]]:
    found = []
    for line in log.read_text().splitlines()[since:]:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("event") == name:
            found.append(entry)
    return found


def warnings_of(log: Path, name: str, since: int = 0) -> list[dict[str, Any]]:
    return [e for e in events(log, name, since) if e.get("level") == "warning"]


@pytest.mark.e2e
@pytest.mark.xdist_group("database-drills")  # one drill at a time: see test_database_faults.py
async def test_refused_connections_and_a_claim_timeout_are_waited_out_logged_once_and_reported_by_readyz(
    engine: AsyncEngine,
    pg_server_url: str,
    receiver: Receiver,
    procs: Processes,
    limited_role: tuple[str, str],
) -> None:
    role, role_url = limited_role
    tenant, target = await make_tenant_and_target(engine, receiver.url(), timeout_s=3)
    port = free_port()
    env = cluster_env(
        role_url,
        CRONHOOK_PORT=str(port),
        CRONHOOK_DB_STATEMENT_TIMEOUT_S=str(STATEMENT_TIMEOUT_S),
        CRONHOOK_AUTO_MIGRATE="false",
    )
    procs.start("up", ["up"], env)
    log = procs.log_dir / "up.log"

    async def delivered(n: int) -> bool:
        return await count_jobs(engine, jobs.c.state == "succeeded") >= n

    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
        await wait_until_ready(http, timeout=60)
        await make_jobs(engine, tenant, target, 5)
        await wait_for(lambda: delivered(5), timeout=30, message="deliveries before the outage")

        # 1. The database refuses this role's connections, and drops the ones it had. (Each
        # part reads the log from its start: an episode before it is not this one.)
        outage_began = lines_so_far(log)
        await admin_execute(pg_server_url, f'ALTER ROLE "{role}" CONNECTION LIMIT 0')
        await admin_execute(
            pg_server_url, f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'"
        )
        await make_jobs(engine, tenant, target, 5)  # due during the outage

        async def readyz_says_why() -> bool:
            answer = await http.get("/readyz")
            return answer.status_code == 503 and "too many connections" in (answer.json().get("reason") or "")

        await wait_for(readyz_says_why, timeout=OUTAGE_S + 20, message="/readyz names the refusal")
        await asyncio.sleep(OUTAGE_S)  # the outage itself, not a wait for a result
        assert await count_jobs(engine, jobs.c.state == "succeeded") == 5, "delivered during the outage?"
        await admin_execute(pg_server_url, f'ALTER ROLE "{role}" CONNECTION LIMIT -1')

        # Back without operator action: ready again, and the jobs due meanwhile delivered.
        await wait_until_ready(http, timeout=30)
        await wait_for(lambda: delivered(10), timeout=30, message="deliveries after the outage")
        for service in ("scheduler", "reaper"):
            await wait_for(
                functools.partial(events, log, f"{service}_db_recovered", outage_began),
                timeout=30,
                message=f"{service} recovered",
            )
            # Once per episode, however many passes failed meanwhile.
            unavailable = warnings_of(log, f"{service}_db_unavailable", outage_began)
            assert len(unavailable) == 1, (service, unavailable)
            # The episode starts when its connections are cut or when it is refused.
            reason = unavailable[0]["reason"]
            assert "too many connections" in reason or "connection to the database failed" in reason, reason
            (recovered,) = events(log, f"{service}_db_recovered", outage_began)
            assert recovered["failed_passes"] >= 2, recovered

        # 2. The claim runs into the statement timeout: jobs is locked by a long transaction.
        await make_jobs(engine, tenant, target, 5, due_in_s=1)
        lock_began = lines_so_far(log)
        async with engine.begin() as conn:
            await conn.execute(text("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE"))

            def claim_timed_out() -> bool:
                return any(
                    "statement_timeout" in e["reason"] for e in warnings_of(log, "scheduler_db_unavailable", lock_began)
                )

            await wait_for(claim_timed_out, timeout=OUTAGE_S + 20, message="the claim hit the statement timeout")
            await asyncio.sleep(min(OUTAGE_S, 4))  # more timed-out passes (idle-in-transaction: 10 s)
        await wait_for(lambda: delivered(15), timeout=30, message="deliveries after the lock")
        await wait_for(
            lambda: len(events(log, "scheduler_db_recovered", lock_began)) >= 1,
            timeout=30,
            message="scheduler recovered",
        )
        unavailable = warnings_of(log, "scheduler_db_unavailable", lock_began)
        assert len(unavailable) == 1, ("a statement-timeout outage is logged once", unavailable)
        assert "statement_timeout" in unavailable[0]["reason"]
        assert "Traceback" not in log.read_text(), "an outage was logged as a bug"
