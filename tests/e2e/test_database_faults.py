"""Database fault drills on real PostgreSQL 15 servers the tests start themselves
(tests/pg_cluster.py), under running `cronhook scheduler` and `cronhook reaper` processes:

- failover: the primary crashes with jobs due, its synchronous standby is promoted, and the
  processes follow the multi-host URL to it;
- a commit stall: the synchronous standby stops, so every commit waits for it;
- a lock held by another session on `jobs`;
- connection refusals at max_connections (SQLSTATE 53300) while a scheduler starts;
- a password with every URL-special character, checked by a scram-sha-256 server.

Each drill ends with no job lost (every job delivered and succeeded), repeats only of
deliveries in flight at the fault (jobs leased when it struck), the warnings and readiness
answers the operator relies on, and recovery without restarting cronhook.
"""

from __future__ import annotations

import asyncio
import string
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import httpx
import pytest
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from app.db.engine import create_engine, normalize_url
from app.db.migrate import migrate_to_head
from app.metrics import sample_value
from app.store.tables import jobs
from tests.e2e.test_database_stall import events, readyz
from tests.e2e.test_processes import CRONHOOK, Processes, base_env, free_port
from tests.factories import make_jobs, make_jobs_bulk, make_tenant_and_target
from tests.pg_cluster import PG_BIN, PgCluster, PgNode, available
from tests.receiver import Receiver, Reply, wait_for

# The database drills stop, stall and fail over servers under live processes and time
# what they log: one at a time on one xdist worker, so two drills never starve each other
# of the two cores (their deadlines assume a drill has the box to itself, as it did serially).
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.xdist_group("database-drills"),
    pytest.mark.skipif(not available(), reason=f"PostgreSQL 15 server binaries not found in {PG_BIN}"),
]

DATABASE = "cronhook"
ROLE = "cronhook"
# Every character a URL parser could trip on, and the quotes a shell or SQL could.
SPECIAL_PASSWORD = "p@ss/w#rd?:%&=;[] '\"" + string.punctuation
# Generous for two busy cores: a start-up, a failover or a catch-up takes seconds there.
START_S = 60.0
SETTLE_S = 60.0


@pytest.fixture
def cluster() -> Iterator[PgCluster]:
    with PgCluster() as servers:
        yield servers


@pytest.fixture
def services(cluster: PgCluster, procs: Processes) -> Processes:
    """The cronhook processes, set up after the servers and so stopped before they go."""
    return procs


@dataclass
class Drill:
    """One drill's database, seen by the test (`engine`) and by cronhook (`env`)."""

    engine: AsyncEngine
    tenant: uuid.UUID
    target: uuid.UUID
    url: str
    password_file: Path
    clients: list[httpx.AsyncClient] = field(default_factory=list)

    async def close(self) -> None:
        for client in self.clients:
            await client.aclose()
        await self.engine.dispose()

    def env(self, **overrides: str) -> dict[str, str]:
        settings = {
            "CRONHOOK_DATABASE_URL": self.url,
            "CRONHOOK_DATABASE_PASSWORD_FILE": str(self.password_file),
            "CRONHOOK_POLL_INTERVAL_S": "0.1",
            "CRONHOOK_PARTITION_LEASE_S": "2",
            "CRONHOOK_PARTITION_RENEW_S": "0.4",
            "CRONHOOK_LEASE_S": "8",
            "CRONHOOK_MAX_TARGET_TIMEOUT_S": "3",
            "CRONHOOK_LEASE_MARGIN_S": "1",
            "CRONHOOK_DEFAULT_TARGET_TIMEOUT_S": "3",
            "CRONHOOK_REAPER_INTERVAL_S": "0.3",
            "CRONHOOK_DB_STALL_WARN_S": "1",
            "CRONHOOK_DB_POOL_SIZE": "4",
            "CRONHOOK_LOG_FORMAT": "json",
        }
        return base_env(**{**settings, **overrides})


async def prepare(cluster: PgCluster, nodes: list[PgNode], receiver: Receiver, tmp: Path) -> Drill:
    """cronhook's role and database on the first node (the primary), migrated as that role,
    with a tenant and a target at the receiver; cronhook reaches them at all `nodes`."""
    await asyncio.to_thread(cluster.create_database, nodes[0], DATABASE, ROLE, SPECIAL_PASSWORD)
    password_file = tmp / "db-password"
    password_file.write_text(SPECIAL_PASSWORD + "\n")
    # Pre-ping: the test's own pool must follow a failover at once.
    engine = create_engine(cluster.url(nodes, DATABASE, ROLE, SPECIAL_PASSWORD), pool_size=1, pre_ping=True)
    await migrate_to_head(engine)
    tenant, target = await make_tenant_and_target(engine, receiver.url(), timeout_s=2.0)
    return Drill(engine, tenant, target, cluster.url(nodes, DATABASE, ROLE), password_file)


@dataclass
class Role:
    name: str
    proc: subprocess.Popen[bytes]
    http: httpx.AsyncClient
    services: Processes

    def log(self) -> str:
        return self.services.log(self.name)

    def serving(self) -> bool:
        """Its log says its probe server listens, or it has exited."""
        return self.proc.poll() is not None or bool(events(self.log(), "probe_server_started"))

    def assert_running(self) -> None:
        assert self.proc.poll() is None, f"{self.name} exited {self.proc.returncode}:\n{self.log()[-3000:]}"


async def start_role(services: Processes, drill: Drill, command: str, serving: bool = True, **overrides: str) -> Role:
    """The role's process with its probe server on a free port, started and (with `serving`)
    serving: its probe server starts once the database answers. A port picked free can be
    taken by another test's process before the role binds it (the role then exits saying so):
    that start is retried on another port, so a readiness answer is never another process's."""
    for _ in range(3):
        port = free_port()
        proc = services.start(command, [command], drill.env(CRONHOOK_METRICS_PORT=str(port), **overrides))
        http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5)
        drill.clients.append(http)
        role = Role(command, proc, http, services)
        if not serving:
            return role
        await wait_for(role.serving, timeout=START_S, interval=0.1, message=f"{command}'s probe server")
        if proc.poll() is None:
            return role
        assert "already in use" in role.log(), f"{command} exited {proc.returncode}:\n{role.log()[-3000:]}"
    raise AssertionError(f"{command}: three free ports were taken before it could bind one")


async def wait_ready(role: Role, timeout: float = START_S) -> None:
    async def ready() -> bool:
        role.assert_running()
        return await readyz(role.http) == 200

    await wait_for(ready, timeout=timeout, interval=0.1, message=f"{role.name} ready")


async def wait_unready(role: Role, timeout: float = 30.0) -> dict[str, Any]:
    """Until the role's /readyz answers 503; its body."""
    body: dict[str, Any] = {}

    async def unready() -> bool:
        nonlocal body
        try:
            answer = await role.http.get("/readyz")
        except httpx.TransportError:
            return False
        body = answer.json()
        return answer.status_code == 503

    await wait_for(unready, timeout=timeout, interval=0.1, message=f"{role.name} not ready")
    return body


async def unfinished(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int(await conn.scalar(select(func.count()).where(jobs.c.state != "succeeded")) or 0)


async def all_succeeded(engine: AsyncEngine) -> bool:
    return await unfinished(engine) == 0


async def leased_webhook_ids(conn: AsyncConnection) -> set[str]:
    """The webhook ids of the jobs leased now: the deliveries in flight (app/services/dispatcher.py
    names a delivery msg_<occurrence id>)."""
    rows = await conn.execute(select(jobs.c.occurrence_id).where(jobs.c.state == "running"))
    return {f"msg_{occurrence.hex}" for occurrence in rows.scalars()}


async def leased_on(cluster: PgCluster, node: PgNode) -> set[str]:
    """leased_webhook_ids read with the superuser (on a standby: what the primary had committed)."""
    engine = create_async_engine(normalize_url(cluster.superuser_url(node, DATABASE)), poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            return await leased_webhook_ids(conn)
    finally:
        await engine.dispose()


def assert_delivered_once_but_in_flight(receiver: Receiver, expected: int, in_flight: set[str]) -> None:
    """Every job delivered; a repeat only of a delivery in flight at the fault."""
    ids = Counter(receiver.webhook_ids())
    assert len(ids) == expected, f"{expected - len(ids)} jobs never delivered"
    repeated = {webhook_id for webhook_id, n in ids.items() if n > 1}
    assert repeated <= in_flight, (
        f"delivered twice though not in flight at the fault: {sorted(repeated - in_flight)[:3]} "
        f"({len(in_flight)} in flight)"
    )


def logged(services: Processes, role: Role, event: str) -> Callable[[], list[dict[str, Any]]]:
    """A wait_for predicate: `event` in the role's log, read again at each poll."""
    return lambda: events(services.log(role.name), event)


async def roles_delivering(services: Processes, drill: Drill, receiver: Receiver, jobs: int) -> tuple[Role, Role]:
    """A scheduler and a reaper, ready, with `jobs` delivered through them: the steady state
    every drill breaks."""
    scheduler = await start_role(services, drill, "scheduler")
    reaper = await start_role(services, drill, "reaper")
    await wait_ready(scheduler)
    await wait_ready(reaper)
    # /readyz answers ready from the start (no commit has failed yet): the scheduler is
    # working once it holds partitions.
    await wait_for(logged(services, scheduler, "partitions_rebalanced"), timeout=START_S, message="partitions held")
    await make_jobs(drill.engine, drill.tenant, drill.target, jobs)

    def delivered() -> bool:
        scheduler.assert_running()
        return len(receiver.requests) >= jobs

    try:
        await wait_for(delivered, timeout=SETTLE_S, message=f"first {jobs} delivered")
    except AssertionError as exc:
        arrived = len(receiver.requests)
        raise AssertionError(f"{exc}; {arrived} arrived. The scheduler's log:\n{scheduler.log()[-4000:]}") from None
    return scheduler, reaper


async def test_failover_to_the_synchronous_standby_loses_nothing(
    cluster: PgCluster, receiver: Receiver, services: Processes
) -> None:
    primary = await asyncio.to_thread(cluster.primary)
    standby = await asyncio.to_thread(cluster.add_standby, primary, "standby", True)
    drill = await prepare(cluster, [primary, standby], receiver, services.log_dir)
    try:
        scheduler, reaper = await roles_delivering(services, drill, receiver, 30)

        # Slow answers keep deliveries in flight when the primary goes; more jobs fall due
        # through the outage.
        receiver.default = Reply(delay_s=0.4)
        await make_jobs_bulk(drill.engine, drill.tenant, drill.target, 80, due_in_s=0.2, spread_s=4.0)
        await wait_for(lambda: len(receiver.requests) >= 40, timeout=SETTLE_S, message="deliveries under way")
        await asyncio.to_thread(cluster.crash, primary)
        # What the primary had committed is on the synchronous standby, readable before it is
        # promoted: the leased jobs there are the deliveries in flight at the crash.
        await asyncio.to_thread(cluster.wait_replayed, standby)
        in_flight = await leased_on(cluster, standby)

        for role in (scheduler, reaper):
            await wait_for(
                logged(services, role, f"{role.name}_db_unavailable"),
                timeout=30,
                message=f"{role.name} saw the outage",
            )
        body = await wait_unready(scheduler)
        assert "no database commit has completed" in body["reason"], body
        await asyncio.to_thread(cluster.promote, standby)

        await wait_for(lambda: all_succeeded(drill.engine), timeout=SETTLE_S, interval=0.25, message="all delivered")
        await wait_ready(scheduler, timeout=30)
        await wait_ready(reaper, timeout=30)
        assert_delivered_once_but_in_flight(receiver, 110, in_flight)
        for role in (scheduler, reaper):
            assert role.proc.poll() is None, f"{role.name} exited: it should have ridden out the failover"
            # Logged by the role's own next pass, which may still be in its backoff after the
            # outage while its commit probe (readiness) has already recovered.
            await wait_for(
                logged(services, role, f"{role.name}_db_recovered"),
                timeout=30,
                message=f"{role.name} logged its recovery",
            )
            assert "Traceback" not in services.log(role.name), services.log(role.name)[-3000:]
        # The multi-host URL leads to the promoted standby now.
        async with drill.engine.connect() as conn:
            assert await conn.scalar(text("SELECT inet_server_port()")) == standby.port
    finally:
        await drill.close()


async def test_a_commit_stall_warns_fails_readiness_and_clears_without_a_restart(
    cluster: PgCluster, receiver: Receiver, services: Processes
) -> None:
    primary = await asyncio.to_thread(cluster.primary)
    standby = await asyncio.to_thread(cluster.add_standby, primary, "standby", True)
    drill = await prepare(cluster, [primary], receiver, services.log_dir)
    try:
        scheduler, reaper = await roles_delivering(services, drill, receiver, 30)

        # These fall due during the stall: their claim is a commit that waits for the standby.
        await make_jobs(drill.engine, drill.tenant, drill.target, 30, due_in_s=1.5)
        await asyncio.to_thread(cluster.stop, standby)

        await wait_for(
            lambda: events(services.log("scheduler"), "database_stalled"), timeout=30, message="stall warned"
        )
        first = events(services.log("scheduler"), "database_stalled")[0]
        assert first["level"] == "warning" and first["role"] == "scheduler", first
        assert first["operation"] in {"claim", "outcome_batch", "ownership_round", "commit_probe"}, first
        assert any("SyncRep" in wait for wait in first["waits"]), first
        for role in (scheduler, reaper):
            body = await wait_unready(role)
            assert "no database commit has completed" in body["reason"], (role.name, body)
        assert (await scheduler.http.get("/healthz")).status_code == 200  # alive: nothing to restart
        exposition = (await scheduler.http.get("/metrics")).text
        assert sample_value(exposition, "cronhook_db_oldest_operation_seconds", {"role": "scheduler"}) >= 1
        # Reads go on during a stall. The deliveries in flight: the jobs leased during it, and
        # those whose claim was waiting for the standby (others see a commit once it returns).
        async with drill.engine.connect() as conn:
            in_flight = await leased_webhook_ids(conn)
        await wait_for(
            lambda: len(events(services.log("scheduler"), "database_stalled")) >= 2, timeout=30, message="repeated"
        )

        await asyncio.to_thread(cluster.start, standby)
        await asyncio.to_thread(cluster.wait_streaming, primary, standby, "sync")
        async with drill.engine.connect() as conn:
            in_flight |= await leased_webhook_ids(conn)
        for role in (scheduler, reaper):
            await wait_for(
                logged(services, role, "database_stall_cleared"),
                timeout=30,
                message=f"{role.name}'s stall cleared",
            )
        await wait_ready(scheduler, timeout=30)
        await wait_ready(reaper, timeout=30)
        await wait_for(lambda: all_succeeded(drill.engine), timeout=SETTLE_S, interval=0.25, message="all delivered")
        assert_delivered_once_but_in_flight(receiver, 60, in_flight)
        (cleared, *_) = events(services.log("scheduler"), "database_stall_cleared")
        assert cleared["lasted_s"] >= 1, cleared
        assert scheduler.proc.poll() is None and reaper.proc.poll() is None
    finally:
        await drill.close()


async def test_a_lock_held_by_another_session_is_named_in_the_warning(
    cluster: PgCluster, receiver: Receiver, services: Processes
) -> None:
    primary = await asyncio.to_thread(cluster.primary)
    drill = await prepare(cluster, [primary], receiver, services.log_dir)
    # The lock holder: a plain session (cronhook's engines end a transaction idle for 10 s).
    holder = create_async_engine(normalize_url(cluster.superuser_url(primary, DATABASE)), poolclass=NullPool)
    try:
        scheduler, reaper = await roles_delivering(services, drill, receiver, 20)

        await make_jobs(drill.engine, drill.tenant, drill.target, 30, due_in_s=1.0)
        async with holder.begin() as conn:
            # Every claim, outcome and rescue reads or writes jobs: they queue behind this.
            await conn.execute(text("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE"))
            locked_at = time.monotonic()
            in_flight = await leased_webhook_ids(conn)

            def lock_warned() -> list[dict[str, Any]]:
                return [
                    e
                    for e in events(services.log("scheduler"), "database_stalled")
                    if any(w.startswith("Lock:") for w in e["waits"])
                ]

            await wait_for(lock_warned, timeout=30, message="the lock wait warned")
            warning = lock_warned()[0]
            assert warning["operation"] in {"claim", "outcome_batch"}, warning
            # Commits go on (the probe touches no table): a lock is not an outage.
            assert await readyz(scheduler.http) == 200
            # The lock lasts about 8 s in all (the fault itself, not a wait for a result).
            await asyncio.sleep(max(0.0, 8.0 - (time.monotonic() - locked_at)))
            assert len(events(services.log("scheduler"), "database_stalled")) >= 2, "no repeat while it lasted"
        # The scheduler stalled (asserted above); the reaper only if a pass of its own met the
        # lock for a warning period, which its timing does not promise. Whoever warned of a
        # stall says when it cleared.
        for role in (scheduler, reaper):
            if not events(role.log(), "database_stalled"):
                continue
            await wait_for(
                logged(services, role, "database_stall_cleared"),
                timeout=30,
                message=f"{role.name}'s stall cleared",
            )
        await wait_for(lambda: all_succeeded(drill.engine), timeout=SETTLE_S, interval=0.25, message="all delivered")
        assert_delivered_once_but_in_flight(receiver, 50, in_flight)
        assert scheduler.proc.poll() is None and reaper.proc.poll() is None
    finally:
        await holder.dispose()
        await drill.close()


async def test_a_scheduler_refused_at_max_connections_waits_and_then_delivers(
    cluster: PgCluster, receiver: Receiver, services: Processes
) -> None:
    # 12 slots, 3 of them kept for superusers: cronhook's role (not one) gets 9.
    primary = await asyncio.to_thread(cluster.primary, "primary", max_connections="12")
    drill = await prepare(cluster, [primary], receiver, services.log_dir)
    await make_jobs(drill.engine, drill.tenant, drill.target, 20)
    await drill.engine.dispose()
    # The test's own look at the jobs takes a superuser's reserved slot.
    control = create_engine(cluster.superuser_url(primary, DATABASE), pool_size=1)
    hogs: list[asyncpg.Connection] = []
    try:
        while True:
            try:
                hogs.append(await asyncpg.connect(cluster.url(primary, DATABASE, ROLE), password=SPECIAL_PASSWORD))
            except asyncpg.TooManyConnectionsError:
                break
            assert len(hogs) <= 12, "max_connections is not enforced"
        scheduler = await start_role(services, drill, "scheduler", serving=False, CRONHOOK_DB_POOL_SIZE="2")

        def refusals() -> list[dict[str, Any]]:
            return events(services.log("scheduler"), "database_wait")

        # Refused, and trying again with backoff (0.25 s, 0.5 s, 1 s, ...) rather than giving up.
        await wait_for(lambda: len(refusals()) >= 3, timeout=30, message="the scheduler retried its connection")
        for refusal in refusals():
            assert "too many connections (53300)" in refusal["reason"], refusal
        assert scheduler.proc.poll() is None, "it gave up instead of waiting"
        assert await unfinished(control) == 20

        for hog in hogs:
            await hog.close()
        hogs.clear()
        await wait_for(lambda: all_succeeded(control), timeout=SETTLE_S, interval=0.25, message="all delivered")
        await wait_ready(scheduler, timeout=30)
        assert_delivered_once_but_in_flight(receiver, 20, set())
        assert "Traceback" not in services.log("scheduler")
    finally:
        for hog in hogs:
            await hog.close()
        await control.dispose()
        await drill.close()


def run(env: dict[str, str], command: str = "migrate") -> subprocess.CompletedProcess[str]:
    return subprocess.run([CRONHOOK, command], env=env, capture_output=True, text=True, timeout=90)


async def test_a_password_with_every_special_character_logs_in_from_a_file_or_the_url(
    cluster: PgCluster, tmp_path: Path
) -> None:
    primary = await asyncio.to_thread(cluster.primary)
    await asyncio.to_thread(cluster.create_database, primary, DATABASE, ROLE, SPECIAL_PASSWORD)
    password_file = tmp_path / "db-password"
    password_file.write_text(SPECIAL_PASSWORD + "\n")
    from_file = base_env(
        CRONHOOK_DATABASE_URL=f"postgresql://{ROLE}@{primary.host}/{DATABASE}",
        CRONHOOK_DATABASE_PASSWORD_FILE=str(password_file),
    )
    result = await asyncio.to_thread(run, from_file)
    assert result.returncode == 0, result.stderr[-3000:]
    # Pasted into the URL as it is, unquoted.
    pasted = base_env(CRONHOOK_DATABASE_URL=f"postgresql://{ROLE}:{SPECIAL_PASSWORD}@{primary.host}/{DATABASE}")
    result = await asyncio.to_thread(run, pasted)
    assert result.returncode == 0, result.stderr[-3000:]
    assert SPECIAL_PASSWORD not in result.stderr
    engine = create_engine(f"postgresql://{ROLE}:{SPECIAL_PASSWORD}@{primary.host}/{DATABASE}", pool_size=1)
    try:
        async with engine.connect() as conn:
            assert await conn.scalar(text("SELECT current_user")) == ROLE
            assert await conn.scalar(text("SELECT count(*) FROM jobs")) == 0  # migrated
    finally:
        await engine.dispose()


async def test_a_wrong_password_is_one_line_not_a_traceback(cluster: PgCluster, tmp_path: Path) -> None:
    primary = await asyncio.to_thread(cluster.primary)
    await asyncio.to_thread(cluster.create_database, primary, DATABASE, ROLE, SPECIAL_PASSWORD)
    password_file = tmp_path / "db-password"
    password_file.write_text("not-" + SPECIAL_PASSWORD + "\n")
    env = base_env(
        CRONHOOK_DATABASE_URL=f"postgresql://{ROLE}@{primary.host}/{DATABASE}",
        CRONHOOK_DATABASE_PASSWORD_FILE=str(password_file),
    )
    # A one-shot command and a service alike: no retrying a password that will not change.
    for command in ("migrate", "scheduler"):
        result = await asyncio.to_thread(run, env, command)
        assert result.returncode != 0, command
        assert "Traceback" not in result.stderr, result.stderr[-3000:]
        lines = [line for line in result.stderr.splitlines() if line.startswith("cronhook:")]
        assert len(lines) == 1 and "password authentication failed" in lines[0], result.stderr[-3000:]
        assert SPECIAL_PASSWORD not in result.stderr
