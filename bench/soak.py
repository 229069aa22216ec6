"""Soak: `--schedulers` (3) `cronhook scheduler` processes (one replica each) and a `cronhook
reaper` under steady load, with a rolling restart, against a receiver that fails 10 % of
requests and times out 1 %; `cronhook api` takes the jobs.

Load: `--recurring` jobs (default 1,000) firing every second (6-field cron `* * * * * *`) plus
`--one-offs-per-s` one-off jobs (default 50) created every second, both through
`POST /v1/jobs/batch`, for `--minutes` (default 10). During the soak each scheduler in turn
gets SIGTERM (graceful stop) and is started again under a new replica id (`--restarts`,
default 3, spread over the run).

Checks and figures (JSON on the last line):
- lost occurrences: fire times of the recurring jobs inside the measured window (from
  `--warmup-s` (15) after the first fire time to a third of that before the end) with neither
  a run row (success, failure, missed, skipped) nor a request at the receiver; one-off jobs
  not delivered or dead-lettered;
- duplicates: webhook-ids answered 2xx more than once, and those of them not explained by a
  documented case (an attempt that timed out, or a lease rescued after its scheduler went
  away with the POST on the wire);
- after the load stops, the services run on until every one-off has finished and every
  recurring job is past the window (a backlog is late, not lost): `settle_after_load_s`;
- lateness (arrival at the receiver minus scheduled time, first attempts) p50/p99/max;
- RSS of every process at the start of the window and at the end;
- PostgreSQL connections to the database (pg_stat_activity), sampled every 2 s: max;
- retention: the reaper's delete rate is measured separately (bench/retention.py).

Default settings for the services (the promises are about them), except loopback egress and
one process per scheduler. Every process is stopped (SIGTERM, then SIGKILL) and the database
dropped, even on failure.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import datetime as dt
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import (
    BATCH_MAX,
    BATCH_PATH,
    BenchDatabase,
    Receipt,
    Receiver,
    Reply,
    Service,
    Services,
    add_database_url_arg,
    lateness_s,
    migrated_engine,
    parse_args,
    positive_int,
    print_result,
    rfc3339,
    run_bench,
)
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

TARGET_TIMEOUT_S = 2.0
SLOW_REPLY_S = TARGET_TIMEOUT_S + 1.0
SETTLE_S = 180.0
ENV = {
    # The bench migrates before starting them.
    "CRONHOOK_AUTO_MIGRATE": "false",
    # One replica per scheduler process: the bench restarts them one by one.
    "CRONHOOK_SCHEDULER_PROCESSES": "1",
}
RETRY = {"max_attempts": 5, "backoff_base_s": 1.0, "backoff_max_s": 10.0}

_CONNECTIONS = text("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
_OPEN_ONE_OFFS = text("SELECT count(*) FROM jobs WHERE schedule_kind = 'once' AND state NOT IN ('succeeded', 'dead')")
_RECURRING_BEHIND = text("SELECT count(*) FROM jobs WHERE schedule_kind = 'cron' AND scheduled_for <= :end")
_RECURRING_IDS = text("SELECT id::text FROM jobs WHERE schedule_kind = 'cron'")
_RECURRING_RUNS = text(
    """
    SELECT r.job_id::text, r.scheduled_for FROM runs r JOIN jobs j ON j.id = r.job_id
    WHERE j.schedule_kind = 'cron' AND r.scheduled_for BETWEEN :start AND :end
    """
)
_OUTCOMES = text("SELECT outcome::text, count(*) FROM runs GROUP BY 1")
# The documented causes of a repeat: the receiver's answer came too late (timeout), or the
# POST was on the wire when its scheduler went away (lease_expired).
_DOCUMENTED_REPEATS = text("SELECT occurrence_id FROM runs WHERE outcome IN ('timeout', 'lease_expired')")


def create_jobs(api: Service, jobs: list[dict[str, Any]]) -> None:
    for start in range(0, len(jobs), BATCH_MAX):
        status, body = api.api("POST", BATCH_PATH, {"jobs": jobs[start : start + BATCH_MAX]})
        if status not in (200, 201) or (body or {}).get("conflicts"):
            raise RuntimeError(f"POST {BATCH_PATH} answered {status}: {str(body)[:300]}")


async def scalar(engine: AsyncEngine, statement: Any, **params: Any) -> int:
    async with engine.connect() as conn:
        return int(await conn.scalar(statement, params) or 0)


@dataclass(frozen=True)
class Load:
    """What the load phase did and saw."""

    first_fire: float  # the recurring jobs' first fire time (epoch seconds)
    one_offs: int
    connections: list[int]  # sampled every 2 s
    restarts: list[dict[str, Any]]
    rss_start: dict[str, float]
    rss_end: dict[str, float]


async def load(
    args: argparse.Namespace, engine: AsyncEngine, services: Services, api: Service, receiver_url: str
) -> Load:
    """Creates the load and restarts the schedulers one by one; what it saw meanwhile."""
    rng = random.Random(args.seed)
    target_id = str(await asyncio.to_thread(api.create_target, f"{receiver_url}/hook", TARGET_TIMEOUT_S))
    first = float(int(time.time()) + 1) + args.warmup_s / 2
    recurring = [
        {"target_id": target_id, "name": f"r{i}", "payload": {"r": i}, "cron": "* * * * * *", **RETRY}
        | {"start_at": rfc3339(first)}
        for i in range(args.recurring)
    ]
    await asyncio.to_thread(create_jobs, api, recurring)
    names = [f"s{i}" for i in range(1, args.schedulers + 1)]
    for name in names:
        services.start(name, "cronhook scheduler", wait=False, replica_id=name)
    # Not waited for: the recurring jobs' first fire times leave them the warm-up to start.
    services.start("reaper", "cronhook reaper", wait=False)

    one_offs = 0
    connections: list[int] = []
    restarts: list[dict[str, Any]] = []
    duration_s = args.minutes * 60
    started = time.monotonic()
    rss_start: dict[str, float] = {}
    restart_at = [duration_s * (i + 1) / (args.restarts + 1) for i in range(args.restarts)]
    generation = collections.Counter[str]()
    next_sample = 0.0
    while (elapsed := time.monotonic() - started) < duration_s:
        tick = time.monotonic()
        batch = [
            {"target_id": target_id, "payload": {"o": one_offs + i}, "run_at": rfc3339(time.time() + rng.random())}
            | RETRY
            for i in range(args.one_offs_per_s)
        ]
        await asyncio.to_thread(create_jobs, api, batch)
        one_offs += len(batch)
        if elapsed >= next_sample:
            connections.append(await scalar(engine, _CONNECTIONS))
            next_sample = elapsed + 2.0
        if not rss_start and elapsed >= args.warmup_s:
            rss_start = services.rss_mb()
        if restart_at and elapsed >= restart_at[0]:
            restart_at.pop(0)
            victim = names[len(restarts) % len(names)]
            current = f"{victim}-{generation[victim]}" if generation[victim] else victim
            stop_s = await asyncio.to_thread(services.stop, current)
            generation[victim] += 1
            replacement = f"{victim}-{generation[victim]}"
            services.start(replacement, "cronhook scheduler", wait=False, replica_id=replacement)
            restarts.append({"stopped": current, "at_s": round(elapsed, 1), "stop_took_s": round(stop_s, 1)})
        services.check_alive()
        await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
    return Load(first, one_offs, connections, restarts, rss_start, services.rss_mb())


async def settle(engine: AsyncEngine, services: Services, window_end: dt.datetime) -> float:
    """Until every one-off has finished and every recurring job is past the window (a backlog
    drained: late, not lost), at most SETTLE_S; the seconds it took."""
    started = time.monotonic()
    while time.monotonic() - started < SETTLE_S:
        services.check_alive()
        if not await scalar(engine, _OPEN_ONE_OFFS) and not await scalar(engine, _RECURRING_BEHIND, end=window_end):
            break
        await asyncio.sleep(0.25)
    return round(time.monotonic() - started, 1)


async def count_lost(engine: AsyncEngine, start: dt.datetime, end: dt.datetime, receipts: list[Receipt]) -> int:
    """Fire times of the recurring jobs in [start, end] with neither a run row nor a request."""
    async with engine.connect() as conn:
        recurring_ids = list((await conn.execute(_RECURRING_IDS)).scalars())
        rows = await conn.execute(_RECURRING_RUNS, {"start": start, "end": end})
        accounted = {(job_id, scheduled_for.timestamp()) for job_id, scheduled_for in rows}
    for receipt in receipts:
        if receipt.scheduled_for:
            accounted.add((receipt.job_id, dt.datetime.fromisoformat(receipt.scheduled_for).timestamp()))
    first = int(start.timestamp()) + (0 if start.timestamp() == int(start.timestamp()) else 1)
    seconds = range(first, int(end.timestamp()) + 1)
    return sum(1 for job_id in recurring_ids for second in seconds if (job_id, float(second)) not in accounted)


async def soak(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    routes = {"/hook": Reply(fail=0.10, slow=0.01, slow_s=SLOW_REPLY_S)}
    database = BenchDatabase(args.database_url)
    async with database as url, Receiver(workdir, routes, seed=args.seed) as receiver:
        engine = await migrated_engine(url, pool_size=4)
        services = Services(url, workdir, ENV)
        try:
            api = services.start("api", "cronhook api")
            seen = await load(args, engine, services, api, receiver.url)
            async with engine.connect() as conn:
                window_end = await conn.scalar(text("SELECT now()")) - dt.timedelta(seconds=args.warmup_s / 3)
            window_start = dt.datetime.fromtimestamp(seen.first_fire + args.warmup_s, dt.UTC)
            settle_s = await settle(engine, services, window_end)
            receipts = await receiver.receipts()
            lost_occurrences = await count_lost(engine, window_start, window_end, receipts)
            undelivered = await scalar(engine, _OPEN_ONE_OFFS)
            async with engine.connect() as conn:
                outcomes = {str(outcome): int(n) for outcome, n in await conn.execute(_OUTCOMES)}
                documented = {
                    f"msg_{occurrence.hex}" for occurrence in (await conn.execute(_DOCUMENTED_REPEATS)).scalars()
                }
        finally:
            await asyncio.to_thread(services.stop_all)
            await engine.dispose()
    replies: dict[str, list[str]] = collections.defaultdict(list)
    for receipt in receipts:
        replies[receipt.webhook_id].append(receipt.reply)
    twice = {msg_id for msg_id, kinds in replies.items() if kinds.count("ok") >= 2}
    late = lateness_s(r for r in receipts if r.attempt == "1")
    fire_times = args.recurring * max(0, int((window_end - window_start).total_seconds()))
    return {
        "bench": "soak",
        "minutes": args.minutes,
        "schedulers": args.schedulers,
        "recurring_jobs": args.recurring,
        "one_offs": seen.one_offs,
        "requests": len(receipts),
        "fire_times_in_window": fire_times,
        "lost_occurrences": lost_occurrences,
        "one_offs_unfinished": undelivered,
        "settle_after_load_s": settle_s,
        "duplicates_2xx_twice": len(twice),
        "duplicates_undocumented": len(twice - documented),
        # Sent again after the receiver answered too late (a timeout): documented, retried.
        "retried_after_receiver_timeout": sum(
            1 for kinds in replies.values() if "slow" in kinds and kinds.count("ok") + kinds.count("slow") >= 2
        ),
        "run_outcomes": outcomes,
        "lateness_s": {
            "p50": round(late[len(late) // 2], 3) if late else None,
            "p99": round(late[min(len(late) - 1, int(0.99 * len(late)))], 3) if late else None,
            "max": round(late[-1], 3) if late else None,
            "mean": round(statistics.fmean(late), 3) if late else None,
        },
        "rss_mb_start": seen.rss_start,
        "rss_mb_end": seen.rss_end,
        "pg_connections": {"max": max(seen.connections, default=0), "last": (seen.connections or [0])[-1]},
        "rolling_restarts": seen.restarts,
        "database": database.kind,
    }


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0, help="soak length (default 10)")
    parser.add_argument("--schedulers", type=positive_int, default=3, help="scheduler processes (default 3)")
    parser.add_argument("--recurring", type=positive_int, default=1000, help="recurring jobs firing every second")
    parser.add_argument("--one-offs-per-s", type=positive_int, default=50, help="one-off jobs created per second")
    parser.add_argument("--restarts", type=int, default=3, help="rolling restarts (SIGTERM, start again)")
    parser.add_argument("--warmup-s", type=float, default=15.0, help="seconds before the measured window opens")
    parser.add_argument("--seed", type=int, default=1)
    add_database_url_arg(parser)
    smoke = {"minutes": 0.04, "schedulers": 1, "recurring": 5, "one_offs_per_s": 5, "restarts": 1, "warmup_s": 0.6}
    return parse_args(parser, argv, smoke)


def healthy(result: dict[str, Any]) -> bool:
    """Nothing lost, nothing delivered twice without a documented cause."""
    return not (result["lost_occurrences"] or result["one_offs_unfinished"] or result["duplicates_undocumented"])


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    result = run_bench("cronhook-soak-", lambda workdir: asyncio.run(soak(args, workdir)))
    print_result(result)
    return 0 if healthy(result) else 1


if __name__ == "__main__":
    sys.exit(main())
