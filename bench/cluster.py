"""Cluster benchmark: real `cronhook scheduler` processes sharing the 256 partitions.

For each `--replicas N`, against a fresh database, it starts N `cronhook scheduler`
processes (CRONHOOK_REPLICA_ID r1..rN, short partition leases) and one `cronhook reaper`,
and measures:

1. throughput: once the N replicas own all 256 partitions in fair shares, K one-off jobs due
   now are inserted set-based in one transaction; the clock runs from its commit until the
   receiver has seen every job's webhook-id. Also: duplicates (webhook-ids received more than
   once) and each replica's share of the deliveries (runs.replica_id);
2. with N >= 2, rebalancing: r1 is SIGKILLed, and partition_leases is polled every 50 ms for
   the time until every partition is held, unexpired, by a survivor, and until the survivors'
   shares are fair (differ by at most one). Then a new replica joins, timed until the shares
   of all live replicas are fair again.

The receiver is the harness's (a child process answering 200 at once). The database is an
embedded PostgreSQL in a temporary folder, or, with --database-url / CRONHOOK_DATABASE_URL,
a new randomly named database on that server, dropped at the end. Every wait has a deadline;
processes are stopped (SIGTERM, then SIGKILL) and the database removed even on failure.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from harness import (
    BenchDatabase,
    Receiver,
    Services,
    add_database_url_arg,
    counts_by,
    jobs_insert_series,
    migrated_engine,
    parse_args,
    positive_int,
    print_result,
    run_bench,
    target_in_store,
    wait_jobs_finished,
)
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.partition import PARTITION_COUNT

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
}
POLL_S = 0.05
STARTUP_TIMEOUT_S = 60.0  # N interpreters importing the app on a small machine
REBALANCE_TIMEOUT_S = 30.0  # 15 partition-lease periods
SETTLE_TIMEOUT_S = 30.0

_LIVE_SHARES = text(
    "SELECT owner, count(*) FROM partition_leases WHERE owner IS NOT NULL AND expires_at > now() GROUP BY owner"
)
_REPLICAS = text("SELECT id FROM replicas")


class BenchError(Exception):
    pass


@dataclass(frozen=True)
class View:
    """Partitions per owner (unexpired leases only) and the replicas registered."""

    shares: collections.Counter[str]
    replicas: frozenset[str]

    @property
    def owned(self) -> int:
        return sum(self.shares.values())


async def view_of(engine: AsyncEngine) -> View:
    async with engine.connect() as conn:
        shares = collections.Counter({str(owner): int(n) for owner, n in await conn.execute(_LIVE_SHARES)})
        replicas = frozenset(str(replica) for replica in (await conn.execute(_REPLICAS)).scalars())
    return View(shares, replicas)


def owned_by(members: set[str]) -> Callable[[View], bool]:
    return lambda view: view.owned == PARTITION_COUNT and set(view.shares) <= members


def fair_among(members: set[str]) -> Callable[[View], bool]:
    def check(view: View) -> bool:
        shares = view.shares.values()
        return view.owned == PARTITION_COUNT and set(view.shares) == members and max(shares) - min(shares) <= 1

    return check


async def watch_leases(
    engine: AsyncEngine,
    services: Services,
    started: float,
    milestones: dict[str, Callable[[View], bool]],
    timeout_s: float,
) -> dict[str, float]:
    """Polls the leases every 50 ms; returns seconds from `started` to each milestone, and
    `max_unowned`, the most partitions seen without a live lease meanwhile."""
    reached: dict[str, float] = {}
    max_unowned = 0
    deadline = started + timeout_s
    while True:
        services.check_alive()
        view = await view_of(engine)
        now = time.monotonic()
        max_unowned = max(max_unowned, PARTITION_COUNT - view.owned)
        for name, check in milestones.items():
            if name not in reached and check(view):
                reached[name] = round(now - started, 3)
        if len(reached) == len(milestones):
            return {**reached, "max_unowned": max_unowned}
        if now > deadline:
            missing = sorted(set(milestones) - set(reached))
            shares = dict(sorted(view.shares.items()))
            raise BenchError(f"no {', '.join(missing)} within {timeout_s:g} s; live shares {shares}")
        await asyncio.sleep(POLL_S)


async def throughput(
    args: argparse.Namespace, engine: AsyncEngine, services: Services, workdir: Path, result: dict[str, Any]
) -> None:
    """Jobs due at once, inserted in one transaction, until every one is delivered."""
    async with Receiver(workdir) as receiver:
        target_id = await target_in_store(engine, f"{receiver.url}/hook", timeout_s=TARGET_TIMEOUT_S)
        t_insert = time.time()
        async with engine.begin() as conn:
            await jobs_insert_series(conn, target_id, args.jobs, t_insert, 0.0)
            # Inside the transaction ANALYZE counts its own inserts, so the first claims are
            # planned for the real backlog rather than an empty table.
            await conn.execute(text("ANALYZE jobs"))
        t_commit = time.time()
        result["insert_s"] = round(t_commit - t_insert, 3)
        deadline = time.monotonic() + args.deadline
        while (stats := await receiver.stats()).distinct < args.jobs:
            services.check_alive()
            if time.monotonic() > deadline:
                result["delivered"] = stats.distinct
                raise BenchError(f"only {stats.distinct} of {args.jobs} jobs delivered in {args.deadline:g} s")
            await asyncio.sleep(POLL_S)
        seconds = max(stats.last_new_at - t_commit, 1e-9)
        left = await wait_jobs_finished(engine, services.check_alive, SETTLE_TIMEOUT_S)
        if left:
            raise BenchError(f"{left} jobs still unfinished {SETTLE_TIMEOUT_S:g} s after the last delivery")
        stats = await receiver.stats()
    result.update(
        delivered=stats.distinct,
        seconds=round(seconds, 3),
        jobs_per_s=round(args.jobs / seconds, 1),
        requests=stats.requests,
        duplicates=stats.requests - stats.distinct,
        runs_per_replica=await counts_by(engine, "runs", "replica_id"),
    )


async def measure(args: argparse.Namespace, replicas: int, url: str, workdir: Path, result: dict[str, Any]) -> None:
    """Fills `result` as it goes, so that a failure still reports what was measured."""
    engine = await migrated_engine(url)
    env = ROLE_ENV | {"CRONHOOK_CONCURRENCY": str(args.concurrency), "CRONHOOK_BATCH_SIZE": str(args.batch_size)}
    services = Services(url, workdir, env)
    try:
        members = {f"r{i}" for i in range(1, replicas + 1)}
        started = time.monotonic()
        for name in sorted(members):
            services.start(name, "cronhook scheduler", wait=False, replica_id=name)
        services.start("reaper", "cronhook reaper", wait=False)
        startup = await watch_leases(engine, services, started, {"fair": fair_among(members)}, STARTUP_TIMEOUT_S)
        result["startup_fair_s"] = startup["fair"]

        # 1. Throughput.
        await throughput(args, engine, services, workdir, result)
        if replicas < 2:
            return

        # 2. A replica dies: its leases expire, the survivors take its partitions over.
        victim = "r1"
        survivors = members - {victim}
        t_kill = time.monotonic()
        services.kill(victim)
        milestones = {"covered": owned_by(survivors), "fair": fair_among(survivors)}
        kill = await watch_leases(engine, services, t_kill, milestones, REBALANCE_TIMEOUT_S)
        result["kill"] = {"victim": victim, **kill}

        # 3. A replica joins: the others shed their surplus, the newcomer acquires it.
        joiner = f"r{replicas + 1}"
        t_spawn = time.monotonic()
        services.start(joiner, "cronhook scheduler", wait=False, replica_id=joiner)
        milestones = {"registered": lambda view: joiner in view.replicas, "fair": fair_among(survivors | {joiner})}
        join = await watch_leases(engine, services, t_spawn, milestones, STARTUP_TIMEOUT_S)
        join["fair_after_registered"] = round(join["fair"] - join["registered"], 3)
        result["join"] = {"joiner": joiner, **join}
    finally:
        await asyncio.to_thread(services.stop_all)
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


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    kind = "external" if args.database_url else "embedded"
    print(
        f"cronhook cluster bench: {args.jobs} jobs, replicas {args.replicas}, {kind} PostgreSQL, "
        f"partition lease {PARTITION_LEASE_S:g} s / renew {PARTITION_RENEW_S:g} s, "
        f"concurrency {args.concurrency}, batch {args.batch_size}, {psutil.cpu_count()} cores"
    )
    results: list[dict[str, Any]] = []
    for replicas in args.replicas:
        result: dict[str, Any] = {"replicas": replicas}
        results.append(result)
        rundir = workdir / f"replicas-{replicas}"
        rundir.mkdir()
        try:
            async with BenchDatabase(args.database_url) as url:
                await measure(args, replicas, url, rundir, result)
        except Exception as exc:
            result["error"] = str(exc) if isinstance(exc, BenchError) else f"{type(exc).__name__}: {exc}"
        print(describe(result))
    return {
        "bench": "cluster",
        "jobs": args.jobs,
        "database": kind,
        "partition_lease_s": PARTITION_LEASE_S,
        "partition_renew_s": PARTITION_RENEW_S,
        "concurrency": args.concurrency,
        "batch_size": args.batch_size,
        "runs": results,
    }


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--replicas", type=positive_int, nargs="+", default=[1, 3], help="scheduler processes, one run per count"
    )
    parser.add_argument("--jobs", type=positive_int, default=10000, help="jobs due at once (default 10000)")
    parser.add_argument("--concurrency", type=positive_int, default=200, help="deliveries in flight per replica")
    parser.add_argument("--batch-size", type=positive_int, default=200, help="jobs claimed per query")
    parser.add_argument("--deadline", type=float, default=300.0, help="give up after this many seconds")
    add_database_url_arg(parser)
    return parse_args(parser, argv, smoke={"replicas": [1], "jobs": 50, "deadline": 30.0})


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    result = run_bench("cronhook-cluster-", lambda workdir: asyncio.run(run(args, workdir)))
    print_result(result)
    return 1 if any("error" in run_ for run_ in result["runs"]) else 0


if __name__ == "__main__":
    sys.exit(main())
