"""The `cronhook` command's roles as a user runs them: migrate, api, openapi, several processes
migrating one empty database at once (AUTO_MIGRATE, serialised by an advisory lock), several
processes sharing one embedded PostgreSQL that stops when the last one exits, the
CRONHOOK_CONCURRENCY cap on one scheduler's deliveries in flight, and `api-key` verbs that
refuse to start a database of their own."""

from __future__ import annotations

import datetime as dt
import json
import os
import secrets
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import psutil
import pytest
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.engine import create_engine
from app.db.migrate import head_revision, schema_is_current
from app.store.jobs import db_now
from app.store.tables import jobs
from tests.conftest import admin_execute, database_url, make_job, make_target
from tests.e2e.test_cluster import log_events
from tests.e2e.test_processes import CRONHOOK, Processes, base_env, free_port, wait_until_ready
from tests.factories import make_jobs, make_tenant_and_target
from tests.receiver import Receiver, Reply, wait_for

pytestmark = pytest.mark.e2e

OPENAPI = Path(__file__).resolve().parents[2] / "openapi" / "openapi.json"


@pytest.fixture
async def empty_db(pg_server_url: str) -> AsyncIterator[str]:
    """A database with no schema at all, as on a first deployment."""
    name = f"cronhook_test_{secrets.token_hex(6)}_empty"
    await admin_execute(pg_server_url, f'CREATE DATABASE "{name}"')
    try:
        yield database_url(pg_server_url, name)
    finally:
        await admin_execute(pg_server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def versions(url: str) -> list[str]:
    engine = create_engine(url, pool_size=1)
    try:
        async with engine.connect() as conn:
            return list((await conn.execute(text("SELECT version_num FROM alembic_version"))).scalars())
    finally:
        await engine.dispose()


def exited(pid: int) -> bool:
    """The process is gone, or has exited and waits to be reaped by us (the test process is
    the subreaper of the daemonised server, see tests/conftest.py)."""
    try:
        if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
            return False
    except psutil.NoSuchProcess:
        return True
    os.waitpid(pid, 0)
    return True


def test_openapi_prints_the_committed_document() -> None:
    result = subprocess.run([CRONHOOK, "openapi"], env=base_env(), capture_output=True, timeout=60, check=True)
    assert json.loads(result.stdout) == json.loads(OPENAPI.read_text())


async def test_migrate_brings_an_empty_database_to_head_and_is_idempotent(empty_db: str) -> None:
    for _ in range(2):
        result = subprocess.run(
            [CRONHOOK, "migrate"], env=base_env(CRONHOOK_DATABASE_URL=empty_db), capture_output=True, timeout=120
        )
        assert result.returncode == 0, result.stderr.decode()[-2000:]
    assert await versions(empty_db) == [head_revision()]
    engine = create_engine(empty_db, pool_size=1)
    try:
        assert await schema_is_current(engine)
    finally:
        await engine.dispose()


async def test_processes_starting_at_once_on_an_empty_database_migrate_it_once(empty_db: str, procs: Processes) -> None:
    # AUTO_MIGRATE is on by default: each of them migrates at start-up, under the advisory lock.
    env = base_env(CRONHOOK_DATABASE_URL=empty_db, CRONHOOK_POLL_INTERVAL_S="0.2")
    names = ["scheduler-1", "scheduler-2", "scheduler-3", "reaper-1"]
    started = [procs.start(name, [name.split("-")[0]], {**env, "CRONHOOK_REPLICA_ID": name}) for name in names]

    def all_started() -> bool:
        return all(
            log_events(procs.log_dir / f"{n}.log", "scheduler_started" if n.startswith("s") else "reaper_started")
            for n in names
        )

    # Each waits for the database and the lock; a failed migration would have ended a process.
    await wait_for(
        lambda: all_started() or any(p.poll() is not None for p in started), timeout=90, message="all started"
    )
    assert all(p.poll() is None for p in started), [procs.log(n)[-1500:] for n in names]
    assert await versions(empty_db) == [head_revision()]
    # Exactly one of them applied the migrations; the others found the schema current.
    migrated = [n for n in names if log_events(procs.log_dir / f"{n}.log", "schema_migrated")]
    assert len(migrated) == 1, migrated
    assert [procs.terminate(p) for p in started] == [0, 0, 0, 0]


async def test_api_serves_requests_and_delivers_nothing(
    db_url: str, engine: AsyncEngine, receiver: Receiver, procs: Processes
) -> None:
    port = free_port()
    key = "chk_e2e_api_only_key"
    env = base_env(CRONHOOK_DATABASE_URL=db_url, CRONHOOK_BOOTSTRAP_API_KEY=key, CRONHOOK_POLL_INTERVAL_S="0.1")
    api = procs.start("api", ["api", "--port", str(port)], env)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
        await wait_until_ready(http, timeout=60)
        auth = {"Authorization": f"Bearer {key}"}
        target = await make_target(http, auth, receiver.url())
        job = await make_job(http, auth, target["id"])  # due at once
        async with engine.connect() as conn:
            later = await db_now(conn) + dt.timedelta(seconds=2)

        async def past() -> bool:
            async with engine.connect() as conn:
                return await db_now(conn) > later

        # Twenty poll intervals of a scheduler, on the database's clock: none runs here.
        await wait_for(past, timeout=30, message="two seconds on the database clock")
        assert (await http.get(f"/v1/jobs/{job['id']}", headers=auth)).json()["state"] == "scheduled"
    assert receiver.requests == []
    assert procs.terminate(api) == 0


async def test_processes_share_one_embedded_server_that_stops_when_the_last_exits(
    receiver: Receiver, procs: Processes
) -> None:
    data_dir = Path(f"/tmp/chs{secrets.token_hex(3)}")  # short: the socket path must stay small
    port = free_port()
    key = "chk_e2e_shared_embedded"
    env = base_env(CRONHOOK_DATA_DIR=str(data_dir), CRONHOOK_BOOTSTRAP_API_KEY=key, CRONHOOK_POLL_INTERVAL_S="0.1")
    postmaster = data_dir / "pg" / "postmaster.pid"
    try:
        api = procs.start("api", ["api", "--port", str(port)], env)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            await wait_until_ready(http, timeout=90)
            scheduler = procs.start("scheduler", ["scheduler"], env)
            auth = {"Authorization": f"Bearer {key}"}
            target = await make_target(http, auth, receiver.url())
            job = await make_job(http, auth, target["id"])
            # The scheduler delivers a job the API created: both on the one server.
            await wait_for(lambda: len(receiver.requests) == 1, timeout=90, message="delivered via the shared server")
            assert receiver.requests[0].headers["cronhook-job-id"] == job["id"]
        server_pid = int(postmaster.read_text().splitlines()[0])
        assert procs.terminate(api) == 0
        # One process still attached: the server keeps running for it.
        assert postmaster.exists() and psutil.pid_exists(server_pid)
        assert scheduler.poll() is None and log_events(procs.log_dir / "scheduler.log", "scheduler_started")
        assert procs.terminate(scheduler) == 0
        # The last one detached: the server stopped with it.
        await wait_for(lambda: not postmaster.exists(), timeout=30, message="embedded server stopped")
        await wait_for(lambda: exited(server_pid), timeout=30, message="postmaster gone")
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


async def test_concurrency_caps_one_schedulers_deliveries_in_flight(
    db_url: str, engine: AsyncEngine, receiver: Receiver, procs: Processes
) -> None:
    receiver.default = Reply(delay_s=1.0)
    tenant, target = await make_tenant_and_target(engine, receiver.url(), timeout_s=5)
    await make_jobs(engine, tenant, target, 12)
    env = base_env(
        CRONHOOK_DATABASE_URL=db_url,
        CRONHOOK_CONCURRENCY="3",
        # One tenant here: its fair share (half the slots by default) would cap it first.
        CRONHOOK_TENANT_MAX_SHARE="1",
        CRONHOOK_BATCH_SIZE="10",
        CRONHOOK_POLL_INTERVAL_S="0.05",
    )
    procs.start("scheduler", ["scheduler"], env)

    async def all_succeeded() -> bool:
        async with engine.connect() as conn:
            return await conn.scalar(select(func.count()).where(jobs.c.state != "succeeded")) == 0

    await wait_for(all_succeeded, timeout=90, interval=0.2, message="all twelve delivered")
    # Three at a time: the cap was reached and never passed.
    assert receiver.max_in_flight["/hook"] == 3
    assert len({r.headers["cronhook-job-id"] for r in receiver.requests}) == 12


@pytest.mark.parametrize("verb", [["create", "--tenant", "acme"], ["list"]])
def test_api_key_verbs_never_create_a_database_they_did_not_find(verb: list[str], tmp_path: Path) -> None:
    # From an empty directory, no server named, no CRONHOOK_DATABASE_URL: not a fresh embedded
    # server with a key no real server knows, but one line saying where to point.
    result = subprocess.run([CRONHOOK, "api-key", *verb], env=base_env(), cwd=tmp_path, capture_output=True, timeout=60)
    err = result.stderr.decode()
    assert result.returncode == 2 and result.stdout == b"", err
    assert str(tmp_path / ".cronhook" / "pg") in err and "CRONHOOK_URL" in err
    assert list(tmp_path.iterdir()) == []
