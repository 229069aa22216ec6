"""Retention delete rate: how fast the reaper's batches clear old history.

A fresh database gets `--jobs` finished one-off jobs (default 100,000), each with one run, aged
past CRONHOOK_RETENTION_DAYS on the database's clock, plus `--recurring` recurring jobs
(default 20) with `--runs-per-job` runs each (default 5,000) of which the newest
CRONHOOK_RUNS_KEPT_PER_JOB (default 1,000) are kept. Reaper.retain() (the reaper's retention
pass: one batch of each delete, each in its own transaction) is then called back to back
until nothing is left to delete; the figure is rows deleted per second (jobs with their
runs; surplus runs), and the longest single batch (how long a batch holds its row locks).
JSON on the last line.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import time
import uuid
from typing import Any

from dispatch import BenchDatabase, add_database_url_arg
from sqlalchemy import func, select, text

from app.db.engine import create_engine
from app.db.migrate import migrate_to_head
from app.services.reaper import Reaper, ReaperConfig
from app.settings import default_of
from app.store.tables import jobs, runs
from app.store.targets import target_create
from app.store.tenants import tenant_ensure


async def seed(engine: Any, args: argparse.Namespace, retention_days: float) -> None:
    async with engine.begin() as conn:
        tenant = await tenant_ensure(conn, "retention")
        target, _ = await target_create(conn, tenant, name="t", url="https://example.com/", headers={}, timeout_s=2)
        params = {
            "tenant": tenant,
            "target": target["id"],
            "n": args.jobs,
            "age": dt.timedelta(days=retention_days + 1),
        }
        # Finished one-offs, aged past retention, one run each (set-based: seeding is not measured).
        await conn.execute(
            text(
                """
                INSERT INTO jobs (id, tenant_id, target_id, partition, schedule_kind, schedule_anchor_at,
                                  scheduled_for, occurrence_id, payload, state, attempt, max_attempts,
                                  backoff_base_s, backoff_max_s, finished_at)
                SELECT gen_random_uuid(), :tenant, :target, (g % 256), 'once', now(), now(), gen_random_uuid(),
                       '{}'::jsonb, 'succeeded', 1, 5, 2, 600, now() - CAST(:age AS interval)
                FROM generate_series(1, :n) AS g
                """
            ),
            params,
        )
    async with engine.begin() as conn:
        await conn.execute(
            text(
                """
                INSERT INTO runs (job_id, tenant_id, occurrence_id, scheduled_for, attempt, outcome)
                SELECT id, tenant_id, occurrence_id, now(), 1, 'success' FROM jobs WHERE state = 'succeeded'
                """
            )
        )
        for _ in range(args.recurring):
            job_id = uuid.uuid4()
            await conn.execute(
                text(
                    """
                    INSERT INTO jobs (id, tenant_id, target_id, partition, schedule_kind, cron, schedule_anchor_at,
                                      scheduled_for, occurrence_id, payload, state, run_at, attempt, max_attempts,
                                      backoff_base_s, backoff_max_s, occurrences_run)
                    VALUES (:id, :tenant, :target, 0, 'cron', '* * * * *', now(), now() + interval '1 hour',
                            gen_random_uuid(), '{}'::jsonb, 'scheduled', now() + interval '1 hour', 0, 5, 2, 600,
                            :runs)
                    """
                ),
                {**params, "id": job_id, "runs": args.runs_per_job},
            )
            await conn.execute(
                text(
                    """
                    INSERT INTO runs (job_id, tenant_id, occurrence_id, scheduled_for, attempt, outcome)
                    SELECT :id, :tenant, gen_random_uuid(), now(), 1, 'success' FROM generate_series(1, :runs)
                    """
                ),
                {**params, "id": job_id, "runs": args.runs_per_job},
            )
    async with engine.begin() as conn:
        await conn.execute(text("ANALYZE jobs"))
        await conn.execute(text("ANALYZE runs"))


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    database = BenchDatabase(args.database_url)
    url = await database.start()
    engine = create_engine(url, pool_size=2)
    try:
        await migrate_to_head(engine)
        config = ReaperConfig()
        await seed(engine, args, config.retention_days)
        async with engine.connect() as conn:
            runs_before = int(await conn.scalar(select(func.count()).select_from(runs)) or 0)
        reaper = Reaper(engine, config)
        totals = {"jobs_deleted": 0, "runs_deleted": 0}
        longest_pass_s = 0.0
        passes = 0
        started = time.monotonic()
        while True:
            pass_started = time.monotonic()
            counts = await reaper.retain()
            longest_pass_s = max(longest_pass_s, time.monotonic() - pass_started)
            passes += 1
            for key in totals:
                totals[key] += counts[key]
            if not counts["jobs_deleted"] and not counts["runs_deleted"] and reaper._runs_cursor is None:
                break
        elapsed = time.monotonic() - started
        async with engine.connect() as conn:
            runs_after = int(await conn.scalar(select(func.count()).select_from(runs)) or 0)
            jobs_after = int(await conn.scalar(select(func.count()).select_from(jobs)) or 0)
        rows = runs_before - runs_after + totals["jobs_deleted"]
        return {
            "bench": "retention",
            "finished_jobs": args.jobs,
            "recurring_jobs": args.recurring,
            "runs_per_recurring_job": args.runs_per_job,
            "batch_size": config.retention_batch_size,
            "runs_kept_per_job": config.runs_kept_per_job,
            "jobs_deleted": totals["jobs_deleted"],
            "runs_deleted": runs_before - runs_after,
            "jobs_left": jobs_after,
            "runs_left": runs_after,
            "passes": passes,
            "seconds": round(elapsed, 2),
            "rows_deleted_per_s": round(rows / elapsed),
            "jobs_deleted_per_s": round(totals["jobs_deleted"] / elapsed),
            "longest_pass_s": round(longest_pass_s, 3),
            "database": database.kind,
            "measured_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        }
    finally:
        await engine.dispose()
        await database.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=100_000, help="finished one-off jobs past retention")
    parser.add_argument("--recurring", type=int, default=20)
    parser.add_argument("--runs-per-job", type=int, default=5_000)
    add_database_url_arg(parser)
    args = parser.parse_args()
    assert default_of("runs_kept_per_job") < args.runs_per_job, "nothing to trim"
    print(json.dumps(asyncio.run(bench(args))))


if __name__ == "__main__":
    main()
