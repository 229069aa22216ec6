"""Retention delete rate: how fast the reaper's batches clear old history.

A fresh database gets `--jobs` finished one-off jobs (default 100,000), each with one run, aged
past CRONHOOK_RETENTION_DAYS on the database's clock, plus `--recurring` recurring jobs
(default 20) with `--runs-per-job` runs each (default 5,000) of which the newest
`--runs-kept` (CRONHOOK_RUNS_KEPT_PER_JOB, default 1,000) are kept. Reaper.retain() (the
reaper's retention pass: one batch of each delete, each in its own transaction) is then called
back to back until the history is down to what is kept; the figure is rows deleted per second
(jobs with their runs; surplus runs), and the longest single batch (how long a batch holds its
row locks). JSON on the last line.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any

from harness import (
    BENCH_KEY_RING,
    BenchDatabase,
    add_database_url_arg,
    migrated_engine,
    parse_args,
    positive_int,
    print_result,
    run_bench,
    target_in_store,
)
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.services.reaper import Reaper, ReaperConfig

# Finished one-offs, aged past retention, one run each (set-based: seeding is not measured).
_FINISHED = text(
    """
    INSERT INTO jobs (id, tenant_id, target_id, partition, schedule_kind, schedule_anchor_at,
                      scheduled_for, occurrence_id, payload, state, attempt, max_attempts,
                      backoff_base_s, backoff_max_s, finished_at)
    SELECT gen_random_uuid(), t.tenant_id, t.id, (g % 256), 'once', now(), now(), gen_random_uuid(),
           '{}'::jsonb, 'succeeded', 1, 5, 2, 600, now() - CAST(:age AS interval)
    FROM targets t, generate_series(1, :n) AS g
    WHERE t.id = :target
    """
)
_RUNS_OF_FINISHED = text(
    """
    INSERT INTO runs (job_id, tenant_id, occurrence_id, scheduled_for, attempt, outcome)
    SELECT id, tenant_id, occurrence_id, now(), 1, 'success' FROM jobs WHERE state = 'succeeded'
    """
)
_RECURRING = text(
    """
    INSERT INTO jobs (id, tenant_id, target_id, partition, schedule_kind, cron, schedule_anchor_at,
                      scheduled_for, occurrence_id, payload, state, run_at, attempt, max_attempts,
                      backoff_base_s, backoff_max_s, occurrences_run)
    SELECT :id, t.tenant_id, t.id, 0, 'cron', '* * * * *', now(), now() + interval '1 hour',
           gen_random_uuid(), '{}'::jsonb, 'scheduled', now() + interval '1 hour', 0, 5, 2, 600, :runs
    FROM targets t WHERE t.id = :target
    """
)
_RUNS_OF_RECURRING = text(
    """
    INSERT INTO runs (job_id, tenant_id, occurrence_id, scheduled_for, attempt, outcome)
    SELECT :id, tenant_id, gen_random_uuid(), now(), 1, 'success' FROM jobs, generate_series(1, :runs)
    WHERE jobs.id = :id
    """
)


async def seed(engine: AsyncEngine, args: argparse.Namespace, retention_days: float) -> None:
    target = await target_in_store(engine, "https://example.com/", "retention", "t", 2.0)
    async with engine.begin() as conn:
        await conn.execute(_FINISHED, {"target": target, "n": args.jobs, "age": dt.timedelta(days=retention_days + 1)})
    async with engine.begin() as conn:
        await conn.execute(_RUNS_OF_FINISHED)
        for _ in range(args.recurring):
            params = {"id": uuid.uuid4(), "target": target, "runs": args.runs_per_job}
            await conn.execute(_RECURRING, params)
            await conn.execute(_RUNS_OF_RECURRING, params)
    async with engine.begin() as conn:
        await conn.execute(text("ANALYZE jobs"))
        await conn.execute(text("ANALYZE runs"))


async def count(engine: AsyncEngine, table: str) -> int:
    async with engine.connect() as conn:
        return int(await conn.scalar(text(f"SELECT count(*) FROM {table}")) or 0)


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    database = BenchDatabase(args.database_url)
    async with database as url:
        engine = await migrated_engine(url)
        try:
            config = ReaperConfig()
            if args.runs_kept is not None:
                config = dataclasses.replace(config, runs_kept_per_job=args.runs_kept)
            await seed(engine, args, config.retention_days)
            runs_before = await count(engine, "runs")
            # What is left once retention is done: the recurring jobs and their newest runs.
            runs_kept = args.recurring * min(args.runs_per_job, config.runs_kept_per_job)
            reaper = Reaper(engine, config, BENCH_KEY_RING)
            jobs_deleted = passes = 0
            longest_pass_s = 0.0
            started = time.monotonic()
            while passes < args.max_passes:
                pass_started = time.monotonic()
                retained = await reaper.retain()
                longest_pass_s = max(longest_pass_s, time.monotonic() - pass_started)
                passes += 1
                jobs_deleted += retained.jobs_deleted
                # A pass that deleted nothing may still be on its way through the recurring
                # jobs' runs: done when only what is kept is left.
                if not retained.jobs_deleted and not retained.runs_deleted and await count(engine, "runs") <= runs_kept:
                    break
            elapsed = time.monotonic() - started
            runs_after, jobs_after = await count(engine, "runs"), await count(engine, "jobs")
        finally:
            await engine.dispose()
    rows = runs_before - runs_after + jobs_deleted
    return {
        "bench": "retention",
        "finished_jobs": args.jobs,
        "recurring_jobs": args.recurring,
        "runs_per_recurring_job": args.runs_per_job,
        "batch_size": config.retention_batch_size,
        "runs_kept_per_job": config.runs_kept_per_job,
        "jobs_deleted": jobs_deleted,
        "runs_deleted": runs_before - runs_after,
        "jobs_left": jobs_after,
        "runs_left": runs_after,
        "done": jobs_after == args.recurring and runs_after == runs_kept,
        "passes": passes,
        "seconds": round(elapsed, 2),
        "rows_deleted_per_s": round(rows / elapsed),
        "jobs_deleted_per_s": round(jobs_deleted / elapsed),
        "longest_pass_s": round(longest_pass_s, 3),
        "database": database.kind,
        "measured_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=positive_int, default=100_000, help="finished one-off jobs past retention")
    parser.add_argument("--recurring", type=positive_int, default=20, help="recurring jobs with a long history")
    parser.add_argument("--runs-per-job", type=positive_int, default=5_000, help="runs of each recurring job")
    parser.add_argument(
        "--runs-kept", type=positive_int, default=None, help="runs kept per job (default: CRONHOOK_RUNS_KEPT_PER_JOB's)"
    )
    parser.add_argument("--max-passes", type=positive_int, default=100_000, help="give up after this many passes")
    add_database_url_arg(parser)
    smoke = {"jobs": 200, "recurring": 2, "runs_per_job": 30, "runs_kept": 10, "max_passes": 100}
    return parse_args(parser, argv, smoke)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    result = run_bench("cronhook-retention-", lambda _: asyncio.run(bench(args)))
    print_result(result)
    return 0 if result["done"] else 1


if __name__ == "__main__":
    sys.exit(main())
