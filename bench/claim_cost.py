"""What a delivery costs the database and the scheduler's Python, without HTTP: serial cycles of
the scheduler's claim (`job_claim_batch`, autocommit, fenced by all 256 partitions, the
scheduler's fair shares) and its outcome batch (`job_finish_attempts`, autocommit, every attempt
a success) over a backlog of N due one-off jobs, one connection, nothing else running.

PostgreSQL's CPU is read from its backend process (/proc, so the server must be on this
machine: embedded, or a scratch database on `--database-url`); the client's from this process.
Serial and uncontended, so the figures are CPU per job, not the burst's wall-clock rate: the A/B
for a change to the claim, the outcome statement, the row decoding or the indexes of `jobs`.

    .venv/bin/python bench/claim_cost.py                      # 20,000 jobs, batches of 100
    .venv/bin/python bench/claim_cost.py --jobs 50000 --database-url postgresql://postgres@127.0.0.1:5432/postgres

Prints a line, then JSON: `pg_us_per_job` (and its split: `pg_claim_us_per_job`,
`pg_finish_us_per_job`), `client_us_per_job`, `claim_ms_per_batch`,
`finish_ms_per_batch` (wall time of each statement's round trip), `jobs_per_s` (serial).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import resource
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness import (
    BENCH_KEY_RING,
    BenchDatabase,
    add_database_url_arg,
    jobs_insert_series,
    migrated_engine,
    parse_args,
    positive_int,
    print_result,
    run_bench,
    target_in_store,
)
from sqlalchemy import text

from app.domain.fair_share import SlotShares
from app.domain.job import AttemptOutcome, FinishedAttempt, RunOutcome
from app.domain.lifecycle import after_attempt
from app.runtime import settle_collector
from app.store.claims import job_claim_batch
from app.store.outcomes import job_finish_attempts
from app.store.partitions import partition_acquire

OWNER = "bench-claim-cost"


def process_cpu_s(pid: int) -> float:
    """CPU time of a process on this machine: the scheduler's own count in nanoseconds
    (/proc/PID/schedstat), exact for a statement of a few milliseconds, where utime + stime
    (/proc/PID/stat) counts in 10 ms ticks; those where schedstat is missing."""
    try:
        with open(f"/proc/{pid}/schedstat") as schedstat:
            return int(schedstat.read().split()[0]) / 1e9
    except (FileNotFoundError, IndexError, ValueError):
        pass
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    database = BenchDatabase(args.database_url)
    async with database as url:
        # As a scheduler's: one connection, generic plans.
        engine = await migrated_engine(url, pool_size=1, generic_plans=True)
        try:
            if args.setup_sql:
                async with engine.begin() as conn:
                    for statement in args.setup_sql:
                        # As written: a `:name` in it is not a bind parameter.
                        await conn.exec_driver_sql(statement)
            target_id = await target_in_store(engine, "http://127.0.0.1:9/unused")
            async with engine.begin() as conn:
                await jobs_insert_series(conn, target_id, args.jobs, time.time() - 5, 0.0)
            async with engine.connect() as conn:
                await conn.execution_options(isolation_level="AUTOCOMMIT")
                await conn.execute(text("VACUUM ANALYZE jobs"))
                pid = int(await conn.scalar(text("SELECT pg_backend_pid()")) or 0)
            async with engine.begin() as conn:
                held = await partition_acquire(conn, OWNER, 256, 3600.0)
            shares = SlotShares(args.batch, args.batch, max(1, args.batch // 2))
            rng = random.Random(1)
            claim_s = finish_s = 0.0
            # PostgreSQL's CPU per statement kind, read around each statement.
            claim_pg_s = finish_pg_s = 0.0
            done = claims = 0
            # The collector as a scheduler process runs it once started (app/runtime.py).
            settle_collector()
            pg0, cpu0, wall0 = process_cpu_s(pid), self_cpu_s(), time.perf_counter()
            while True:
                t, pg_t = time.perf_counter(), process_cpu_s(pid)
                async with engine.connect() as conn:
                    await conn.execution_options(isolation_level="AUTOCOMMIT")
                    batch = await job_claim_batch(
                        conn, BENCH_KEY_RING, OWNER, args.batch, 60.0, held, 600.0, shares.claim_shares()
                    )
                claim_s += time.perf_counter() - t
                claim_pg_s += process_cpu_s(pid) - pg_t
                if not batch.jobs:
                    break
                claims += 1
                items = []
                for job in batch.jobs:
                    result = AttemptOutcome(RunOutcome.SUCCESS, 200, None, 1, job.claimed_at)
                    step = after_attempt(job.attempt_context(), True, job.claimed_at, rng)
                    items.append(FinishedAttempt(job, result, step))
                t, pg_t = time.perf_counter(), process_cpu_s(pid)
                async with engine.connect() as conn:
                    await conn.execution_options(isolation_level="AUTOCOMMIT")
                    await job_finish_attempts(conn, items)
                finish_s += time.perf_counter() - t
                finish_pg_s += process_cpu_s(pid) - pg_t
                done += len(items)
            wall = time.perf_counter() - wall0
            pg_s, client_s = process_cpu_s(pid) - pg0, self_cpu_s() - cpu0
        finally:
            await engine.dispose()
    return {
        "bench": "claim_cost",
        "jobs": done,
        "batch": args.batch,
        "database": database.kind,
        "pg_us_per_job": round(pg_s / max(done, 1) * 1e6, 1),
        "client_us_per_job": round(client_s / max(done, 1) * 1e6, 1),
        "pg_claim_us_per_job": round(claim_pg_s / max(done, 1) * 1e6, 1),
        "pg_finish_us_per_job": round(finish_pg_s / max(done, 1) * 1e6, 1),
        "claim_ms_per_batch": round(claim_s / max(claims, 1) * 1000, 2),
        "finish_ms_per_batch": round(finish_s / max(claims, 1) * 1000, 2),
        "jobs_per_s": round(done / wall),
    }


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=positive_int, default=20_000, help="due jobs in the backlog (20000)")
    parser.add_argument("--batch", type=positive_int, default=100, help="jobs per claim (the default batch, 100)")
    parser.add_argument(
        "--setup-sql",
        action="append",
        default=[],
        help="a statement run after the migrations, before the backlog (repeatable): the A/B of a schema change",
    )
    add_database_url_arg(parser)
    return parse_args(parser, argv, smoke={"jobs": 200, "batch": 50})


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    result = run_bench("cronhook-claim-cost-", lambda workdir: asyncio.run(run(args, workdir)))
    print(
        f"{result['jobs']} jobs, {result['database']}: PostgreSQL {result['pg_us_per_job']} us and the client "
        f"{result['client_us_per_job']} us of CPU per job; claim {result['claim_ms_per_batch']} ms and outcome "
        f"{result['finish_ms_per_batch']} ms per batch of {result['batch']}"
    )
    print_result(result)
    return 0 if result["jobs"] == args.jobs else 1


if __name__ == "__main__":
    sys.exit(main())
