"""Scale of the store: does the claim stay flat as the jobs table grows, and does a large burst
drain without duplicates on a large table?

On a fresh database (embedded in a temporary folder, or a scratch database on
--database-url's server, dropped at the end):

1. claim latency on the empty table: the scheduler's own claim (app.store.claims.job_claim_due,
   statement construction in Python included), fenced by all 256 partitions held under the
   bench's name: `idle` (nothing due) and `batch` (--batch of 1,000 due jobs), --repeats
   times each, every claim rolled back so the due set stays the same;
2. --not-due (1,000,000) jobs scheduled over the next days and --finished (1,000,000)
   succeeded ones with one run each, inserted set-based (generate_series, one INSERT ... SELECT
   per 250,000 rows), then ANALYZE; the `batch` claims again, against the same 1,000 due jobs;
3. drain: those 1,000 due jobs go, the partitions are handed to `--cronhook-cmd` (default
   `cronhook scheduler`), and --drain jobs (100,000) due within one second are delivered to the
   peers' fast receiver; time from the first due instant to the last receipt, duplicates
   (requests beyond the first per webhook-id) and lost, from the receiver's log;
4. the `idle` claims again, on the big table after the drain, and once more after a VACUUM
   (the drained jobs leave dead entries in the due index until autovacuum gets to them).

Bounded: the drain gives up after --drain-deadline seconds (reporting what arrived).

    .venv/bin/python bench/scale.py
    .venv/bin/python bench/scale.py --not-due 100000 --finished 100000 --drain 10000   # quick
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness import (
    BENCH_KEY_RING,
    BenchDatabase,
    Service,
    add_database_url_arg,
    add_service_args,
    add_yardstick_args,
    jobs_insert_series,
    load_peer,
    migrated_engine,
    parse_args,
    parse_env,
    percentile,
    positive_int,
    print_result,
    run_bench,
    runs_insert_for_finished,
    target_in_store,
    wait_partitions_owned,
)
from profiles import brief, print_profile, profiled
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store.claims import job_claim_due
from app.store.partitions import Held, partition_acquire, partition_release

OWNER = "bench-claim"
DAY_S = 86_400.0


async def claim_latency(engine: AsyncEngine, held: Held, batch: int, repeats: int) -> dict[str, Any]:
    """job_claim_due timed `repeats` times, each in a transaction rolled back afterwards."""
    times: list[float] = []
    claimed = 0
    async with engine.connect() as conn:
        for _ in range(repeats):
            transaction = await conn.begin()
            t = time.perf_counter()
            jobs = await job_claim_due(conn, BENCH_KEY_RING, OWNER, batch, 60.0, held)
            times.append((time.perf_counter() - t) * 1000)
            claimed = len(jobs)
            await transaction.rollback()
    times.sort()
    return {
        "claimed": claimed,
        "ms_p50": round(percentile(times, 50), 2),
        "ms_p90": round(percentile(times, 90), 2),
        "ms_min": round(times[0], 2),
    }


async def hold_all(engine: AsyncEngine) -> Held:
    async with engine.begin() as conn:
        return await partition_acquire(conn, OWNER, 256, 3600.0)


async def release(engine: AsyncEngine, held: Held) -> None:
    async with engine.begin() as conn:
        await partition_release(conn, OWNER, held)


async def count_table(engine: AsyncEngine, sql: str) -> int:
    async with engine.connect() as conn:
        return int(await conn.scalar(text(sql)) or 0)


async def drain(
    args: argparse.Namespace, engine: AsyncEngine, url: str, workdir: Path, rx: Any, target_id: uuid.UUID
) -> dict[str, Any]:
    """--drain jobs due within one second, delivered by the real scheduler process."""
    n = args.drain
    service = Service(args.cronhook_cmd, url, workdir / "cronhook.log", parse_env(args.env))
    out: dict[str, Any] = {"jobs": n, "cmd": args.cronhook_cmd}
    try:
        await asyncio.to_thread(service.start)
        await wait_partitions_owned(engine, service.check_alive, args.settle_s)
        first_due = time.time() + args.lead_s + n / 10_000  # inserting into the big table is slower
        async with engine.begin() as conn:
            await jobs_insert_series(conn, target_id, n, first_due, 1.0 / n)
            await conn.execute(text("ANALYZE jobs"))
        out["created_before_due"] = time.time() < first_due
        await asyncio.sleep(max(0.0, first_due - time.time()))
        cpu0 = service.cpu_s()
        with profiled(args.profile, "scale-drain", service.pid) as profile:
            deadline = first_due + args.drain_deadline
            while time.time() < deadline and (rx.count() or 0) < n:
                service.check_alive()
                await asyncio.sleep(0.25)
            cpu_s = service.cpu_s() - cpu0
        if profile:
            print_profile("scheduler during the drain", profile)
            out["profile"] = brief(profile)
        rx.settle(n, quiet_s=args.quiet_s, timeout=5.0)
    finally:
        await asyncio.to_thread(service.stop)
        rx.stop()
    fig = load_peer("side_by_side").figures(rx.records(), first_due, n)
    distinct = fig.get("distinct") or 0
    out.update(
        delivered=fig["delivered"],
        duplicates=fig.get("duplicates"),
        lost=n - distinct,
        drain_s=fig.get("drain_s"),
        deliveries_per_s=fig.get("deliveries_per_s"),
        late_ms_p50=fig.get("late_ms_p50"),
        late_ms_p99=fig.get("late_ms_p99"),
        cpu_ms_per_delivery=round(cpu_s * 1000 / max(fig["delivered"], 1), 3),
    )
    return out


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    sbs = load_peer("side_by_side", args.peers_dir)
    rx = sbs.Receiver(load_peer("env").ensure_peers_venv(), workdir, "drain")
    result: dict[str, Any] = {"bench": "scale", "batch": args.batch, "repeats": args.repeats}
    try:
        async with BenchDatabase(args.database_url) as url:
            engine = await migrated_engine(url)
            try:
                await measure(args, engine, url, workdir, rx, result)
            finally:
                await engine.dispose()
    finally:
        rx.stop()
    return result


async def measure(
    args: argparse.Namespace, engine: AsyncEngine, url: str, workdir: Path, rx: Any, result: dict[str, Any]
) -> None:
    target_id = await target_in_store(engine, rx.url + "/hook")
    held = await hold_all(engine)
    result["empty_idle"] = await claim_latency(engine, held, args.batch, args.repeats)
    async with engine.begin() as conn:
        await jobs_insert_series(conn, target_id, 1000, time.time() - 60, 0.001)
        await conn.execute(text("ANALYZE jobs"))
    result["empty_batch"] = await claim_latency(engine, held, args.batch, args.repeats)
    print(f"empty table: idle claim {result['empty_idle']}, claim of {args.batch}: {result['empty_batch']}")

    t = time.monotonic()
    async with engine.begin() as conn:
        await jobs_insert_series(conn, target_id, args.not_due, time.time() + DAY_S, 0.1)
        await jobs_insert_series(conn, target_id, args.finished, time.time() - 30 * DAY_S, 1.0, "succeeded")
        await runs_insert_for_finished(conn)
    async with engine.connect() as conn:
        await conn.execute(text("COMMIT"))  # ANALYZE outside a transaction block
        await conn.execute(text("ANALYZE jobs"))
        await conn.execute(text("ANALYZE runs"))
    result["fill_s"] = round(time.monotonic() - t, 1)
    result["rows"] = {
        "jobs": await count_table(engine, "SELECT count(*) FROM jobs"),
        "runs": await count_table(engine, "SELECT count(*) FROM runs"),
    }
    result["big_batch"] = await claim_latency(engine, held, args.batch, args.repeats)
    print(f"{result['rows']} (filled in {result['fill_s']} s): claim of {args.batch}: {result['big_batch']}")

    async with engine.begin() as conn:
        await conn.execute(text("DELETE FROM jobs WHERE state = 'scheduled' AND run_at <= now()"))
    await release(engine, held)
    result["drain"] = await drain(args, engine, url, workdir, rx, target_id)
    print(f"drain: {result['drain']}")

    held = await hold_all(engine)
    result["big_idle"] = await claim_latency(engine, held, args.batch, args.repeats)
    print(f"big table after the drain: idle claim {result['big_idle']}")
    async with engine.connect() as conn:
        await conn.execute(text("COMMIT"))  # VACUUM outside a transaction block
        await conn.execute(text("VACUUM ANALYZE jobs"))
    result["big_idle_vacuumed"] = await claim_latency(engine, held, args.batch, args.repeats)
    print(f"... after VACUUM (the drain's dead index entries gone): {result['big_idle_vacuumed']}")
    result["claim_ratio_big_vs_empty"] = {
        "batch_p50": round(result["big_batch"]["ms_p50"] / result["empty_batch"]["ms_p50"], 2),
        "idle_p50": round(result["big_idle"]["ms_p50"] / result["empty_idle"]["ms_p50"], 2),
        "idle_vacuumed_p50": round(result["big_idle_vacuumed"]["ms_p50"] / result["empty_idle"]["ms_p50"], 2),
    }


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--not-due", type=positive_int, default=1_000_000, help="scheduled jobs due days ahead")
    parser.add_argument("--finished", type=positive_int, default=1_000_000, help="succeeded jobs, one run each")
    parser.add_argument("--batch", type=positive_int, default=100, help="jobs per claim (the default batch size)")
    parser.add_argument("--repeats", type=positive_int, default=30, help="claims timed per figure")
    parser.add_argument("--drain", type=positive_int, default=100_000, help="jobs due within one second")
    parser.add_argument("--drain-deadline", type=float, default=240.0, help="seconds the drain may take")
    parser.add_argument(
        "--lead-s", type=float, default=2.0, help="seconds from the drain's insert to its first due time"
    )
    parser.add_argument("--quiet-s", type=float, default=1.0, help="receiver quiet this long before its log is read")
    add_database_url_arg(parser)
    add_service_args(parser, "cronhook scheduler")
    add_yardstick_args(parser)
    smoke: dict[str, Any] = {"not_due": 200, "finished": 200, "repeats": 2, "drain": 100, "drain_deadline": 20.0}
    smoke |= {"lead_s": 0.5, "quiet_s": 0.2, "settle_s": 0.2, "cronhook_cmd": "cronhook scheduler --processes 1"}
    return parse_args(parser, argv, smoke)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    result = run_bench("cronhook-scale-", lambda workdir: asyncio.run(run(args, workdir)))
    print_result(result)
    drained = result.get("drain", {})
    return 0 if drained.get("lost") == 0 and not drained.get("duplicates") else 1


if __name__ == "__main__":
    sys.exit(main())
