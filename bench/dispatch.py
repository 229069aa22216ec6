"""Dispatch benchmark: how fast, and how late, in-process schedulers deliver a burst of due jobs.

N one-off jobs, all due at the same instant, are inserted set-based into a fresh database;
then `--replicas` Scheduler instances in this process claim and deliver them to the harness's
receiver (a child process answering 200 at once). Reported:

- seconds / deliveries_per_s: from the schedulers' start to the last job's first delivery;
- lateness: receive time minus the job's `cronhook-scheduled-for` header, per delivery
  (p50, p99, max). The jobs fall due before the schedulers start, so this includes the
  set-up "head start" (insert, ANALYZE), printed alongside;
- duplicates: deliveries beyond the first per `webhook-id` (should be 0);
- cpu_ms_per_delivery: CPU time of this process (schedulers, HTTP client, asyncpg and
  SQLAlchemy) per job. The receiver's and PostgreSQL's CPU are not included.

The one bench that runs the Scheduler class itself (no process start-up, no other role): the
A/B for a change inside the scheduler. The replicas share this process and its event loop but
each has its own connection pool, as separate processes would; no reaper runs. Real processes
are cluster.py's and compare.py's.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from harness import (
    BENCH_KEY_RING,
    BenchDatabase,
    Receiver,
    add_database_url_arg,
    counts_by,
    jobs_insert_series,
    jobs_unfinished,
    lateness_s,
    migrated_engine,
    ms_summary,
    parse_args,
    positive_int,
    print_result,
    run_bench,
    target_in_store,
)
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.engine import create_engine
from app.domain.egress import parse_egress_allow
from app.services.scheduler import Scheduler
from app.services.scheduler_config import SchedulerConfig
from app.store.rescues import replica_session_name

TARGET_TIMEOUT_S = 10.0
POLL_S = 0.1


def busy_cores(before: Any, after: Any) -> float:
    """Average number of busy cores between two psutil.cpu_times() samples."""
    idle = (after.idle + getattr(after, "iowait", 0.0)) - (before.idle + getattr(before, "iowait", 0.0))
    total = sum(after) - sum(before)
    if total <= 0:
        return 0.0
    return float((1 - idle / total) * (psutil.cpu_count() or 1))


def scheduler(engine: AsyncEngine, index: int, args: argparse.Namespace) -> Scheduler:
    config = SchedulerConfig(
        replica_id=f"bench-{index}",
        batch_size=args.batch_size,
        concurrency=args.concurrency,
        poll_interval_s=0.05,
        lease_s=60.0,
        max_target_timeout_s=TARGET_TIMEOUT_S,
        lease_margin_s=5.0,
        # The receiver is on loopback, which the egress policy refuses by default.
        egress=parse_egress_allow("127.0.0.0/8"),
    )
    return Scheduler(engine, config, BENCH_KEY_RING)


@dataclass(frozen=True)
class Delivery:
    """What the schedulers' run saw: whether every job was delivered (else why not), when they
    started and the bench stopped waiting (epoch seconds), and the CPU spent meanwhile."""

    finished: bool
    failure: str
    started: float
    ended: float
    cpu_s: float
    receiver_cpu_s: float
    busy_cores: float


async def deliver(args: argparse.Namespace, url: str, receiver: Receiver, control: AsyncEngine) -> Delivery:
    """Starts the schedulers, waits until every job is delivered, stops them."""
    # Each engine as `cronhook scheduler` makes its own (app/runtime.py): sessions on generic
    # plans (else every claim runs in a transaction of its own that sets the plan mode: four
    # round trips, not one) and named after the replica.
    engines = [
        create_engine(url, args.pool_size, application_name=replica_session_name(f"bench-{i}"), generic_plans=True)
        for i in range(args.replicas)
    ]
    schedulers = [scheduler(engine, i, args) for i, engine in enumerate(engines)]
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    try:
        for each in schedulers:
            await each.start()
        receiver_cpu0 = (await receiver.stats()).cpu_s
        machine0, cpu0, started = psutil.cpu_times(), time.process_time(), time.time()
        tasks = [asyncio.create_task(s.run_forever(stop), name=f"scheduler-{i}") for i, s in enumerate(schedulers)]
        deadline = time.monotonic() + args.deadline
        finished, failure = False, ""
        while time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
            crashed = [task for task in tasks if task.done()]
            if crashed:
                failure = f"{crashed[0].get_name()} stopped: {crashed[0].exception()!r}"
                break
            if (await receiver.stats()).distinct >= args.jobs and await jobs_unfinished(control) == 0:
                finished = True
                break
        delivery = Delivery(
            finished,
            failure,
            started,
            ended=time.time(),
            cpu_s=time.process_time() - cpu0,
            receiver_cpu_s=(await receiver.stats()).cpu_s - receiver_cpu0,
            busy_cores=busy_cores(machine0, psutil.cpu_times()),
        )
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        for each in schedulers:
            await each.close(grace_s=10.0)
        schedulers = []
        return delivery
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for each in schedulers:
            await each.close(grace_s=0)
        for engine in engines:
            await engine.dispose()


async def run(args: argparse.Namespace, workdir: Path) -> tuple[int, dict[str, Any]]:
    n: int = args.jobs
    database = BenchDatabase(args.database_url)
    async with database as url, Receiver(workdir) as receiver:
        t = time.monotonic()
        control = await migrated_engine(url)
        try:
            migrate_s = time.monotonic() - t
            target_id = await target_in_store(control, f"{receiver.url}/hook", timeout_s=TARGET_TIMEOUT_S)
            async with control.connect() as conn:
                server_version = await conn.scalar(text("SHOW server_version"))
            print(
                f"cronhook dispatch bench: {n} jobs, {args.replicas} replica(s), concurrency {args.concurrency}, "
                f"batch {args.batch_size}, pool {args.pool_size}/replica, {database.kind} PostgreSQL "
                f"{server_version}, {psutil.cpu_count()} cores"
            )
            t = time.monotonic()
            due = time.time()
            async with control.begin() as conn:
                await jobs_insert_series(conn, target_id, n, due, 0.0)
                # Fresh statistics, so that autovacuum's first ANALYZE cannot change plans mid-run.
                await conn.execute(text("ANALYZE jobs"))
            insert_s = time.monotonic() - t
            seen = await deliver(args, url, receiver, control)
            receipts = await receiver.receipts()
            states = await counts_by(control, "jobs", "state")
            per_replica = await counts_by(control, "runs", "replica_id")
        finally:
            await control.dispose()

    t0 = seen.started
    first: dict[str, float] = {}
    for receipt in receipts:
        first[receipt.webhook_id] = min(receipt.arrived, first.get(receipt.webhook_id, receipt.arrived))
    lateness = ms_summary(lateness_s(receipts))
    from_start = ms_summary(sorted(receipt.arrived - t0 for receipt in receipts))
    delivered = len(first)
    duplicates = len(receipts) - delivered
    last = max(first.values()) if seen.finished and first else seen.ended
    seconds = max(last - t0, 1e-9)
    cpu_ms = round(seen.cpu_s * 1000 / max(delivered, 1), 3)
    if not seen.finished:
        print(f"FAILED: {seen.failure or f'only {delivered} of {n} jobs delivered within {args.deadline:g} s'}")
    print(f"setup: migrate {migrate_s:.2f} s, insert {insert_s:.2f} s, head start {(t0 - due) * 1000:.0f} ms")
    print(f"delivered {delivered}/{n} in {seconds:.3f} s: {delivered / seconds:.0f} deliveries/s")
    print(f"lateness (receive - cronhook-scheduled-for) in ms: {lateness}")
    print(f"receive - schedulers' start (lateness minus head start) in ms: {from_start}")
    print(f"duplicates: {duplicates}")
    print(
        f"cpu: this process {seen.cpu_s:.2f} s ({cpu_ms} ms/delivery), receiver {seen.receiver_cpu_s:.2f} s, "
        f"machine {seen.busy_cores:.2f} busy cores"
    )
    print(f"runs per replica: {per_replica}; job states: {states}")
    result = {
        "bench": "dispatch",
        "jobs": n,
        "replicas": args.replicas,
        "concurrency": args.concurrency,
        "batch_size": args.batch_size,
        "seconds": round(seconds, 3),
        "deliveries_per_s": round(delivered / seconds, 1),
        "lateness_ms_p50": lateness["p50"],
        "lateness_ms_p99": lateness["p99"],
        "lateness_ms_max": lateness["max"],
        "duplicates": duplicates,
        "cpu_ms_per_delivery": cpu_ms,
        "database": database.kind,
    }
    return (0 if seen.finished else 1), result


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=positive_int, default=5000, help="jobs due at once (default 5000)")
    parser.add_argument("--replicas", type=positive_int, default=1, help="Scheduler instances in this process")
    parser.add_argument("--concurrency", type=positive_int, default=200, help="deliveries in flight per replica")
    parser.add_argument("--batch-size", type=positive_int, default=200, help="jobs claimed per query")
    parser.add_argument("--pool-size", type=positive_int, default=10, help="database pool per replica (default 10)")
    parser.add_argument("--deadline", type=float, default=300.0, help="give up after this many seconds")
    add_database_url_arg(parser)
    return parse_args(parser, argv, smoke={"jobs": 50, "replicas": 2, "deadline": 30.0})


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    code, result = run_bench("cronhook-dispatch-", lambda workdir: asyncio.run(run(args, workdir)))
    print_result(result)
    return code


if __name__ == "__main__":
    sys.exit(main())
