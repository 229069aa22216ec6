"""Costs that must stay flat as a tenant grows: with W waiting jobs and F finished ones in one
tenant (default 5,000,000 and 1,000,000), against the same tenant empty, in one run:

- the quota's read of the tenant's unfinished jobs (`tenant_count_active_jobs`: the counter
  kept with the writes, migration 0023), beside the count it replaced;
- single creates through the API (in process, ASGI, the real routes and quotas; 8 at a time
  for `--seconds`): p50 and p99, and PostgreSQL's CPU per create (a server on this machine);
- the scheduler's claim (`job_claim_batch`, batches of 100 over 2,000 due jobs): ms per batch.

Jobs are written by one INSERT ... SELECT per 250,000 (bench/workload.py), through the
triggers, as creates would be.

    .venv/bin/python bench/quota_scale.py --database-url postgresql://postgres@127.0.0.1:5432/postgres
    .venv/bin/python bench/quota_scale.py --waiting 1000000 --finished 200000

Prints a line per phase, then JSON: each phase's figures and the loaded/empty ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
from claim_cost import process_cpu_s
from harness import (
    BENCH_KEY_RING,
    BenchDatabase,
    add_database_url_arg,
    migrated_engine,
    ms_summary,
    parse_args,
    positive_int,
    print_result,
    ratio,
    run_bench,
    target_in_store,
)
from processes import BENCH_SECRET_KEYS
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine
from workload import jobs_insert_series

from app.api.app import create_app
from app.domain.fair_share import SlotShares
from app.settings import Settings
from app.store.claims import job_claim_batch
from app.store.partitions import partition_acquire
from app.store.quotas import tenant_count_active_jobs, tenant_count_active_jobs_exactly
from app.store.tenants import api_key_create, tenant_ensure

OWNER = "bench-quota-scale"
CONCURRENCY = 8
DUE = 2000
CLAIM_BATCH = 100
FAR_FUTURE = time.time() + 10 * 365 * 86400


async def _timed_ms(engine: AsyncEngine, fn: Any, tenant_id: Any, repeat: int) -> float:
    """The median of `repeat` calls, in ms."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        async with engine.begin() as conn:
            await fn(conn, tenant_id)
        times.append(time.perf_counter() - t)
    times.sort()
    return round(times[len(times) // 2] * 1000, 3)


async def _backends_cpu(engine: AsyncEngine) -> dict[int, float] | None:
    """CPU seconds of each server process on this database (None: not on this machine)."""
    async with engine.connect() as conn:
        pids = (await conn.execute(text("SELECT pid FROM pg_stat_activity WHERE datname = current_database()"))).all()
    try:
        return {pid: process_cpu_s(pid) for (pid,) in pids}
    except OSError:
        return None


async def _creates(engine: AsyncEngine, url: str, key: str, target_id: Any, seconds: float) -> dict[str, Any]:
    settings = Settings(
        database_url=url, secret_keys=BENCH_SECRET_KEYS, tenant_max_active_jobs=100_000_000, tenant_requests_per_s=0
    )
    app = create_app(settings, engine=engine)
    latencies: list[float] = []
    body = {"target_id": str(target_id), "payload": {"k": 1}, "delay_s": 365 * 86400}
    auth = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://bench") as http:
        warm = await http.post("/v1/jobs", json=body, headers=auth)
        assert warm.status_code == 201, warm.text
        before = await _backends_cpu(engine)
        deadline = time.perf_counter() + seconds

        async def worker() -> None:
            while time.perf_counter() < deadline:
                t = time.perf_counter()
                answer = await http.post("/v1/jobs", json=body, headers=auth)
                latencies.append(time.perf_counter() - t)
                assert answer.status_code == 201, answer.text

        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
        after = await _backends_cpu(engine)
        pg_s = None
        if before is not None and after is not None:
            pg_s = sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())
    latencies.sort()
    summary = ms_summary(latencies)
    return {
        "creates": len(latencies),
        "create_p50_ms": summary["p50"],
        "create_p99_ms": summary["p99"],
        "pg_us_per_create": round(pg_s / len(latencies) * 1e6, 1) if pg_s is not None else None,
    }


async def _claims(engine: AsyncEngine, target_id: Any, held: Any) -> float:
    """ms per claim of CLAIM_BATCH over DUE due jobs (then left claimed: due no more)."""
    async with engine.begin() as conn:
        await jobs_insert_series(conn, target_id, DUE, time.time() - 5, 0.0)
    shares = SlotShares(CLAIM_BATCH, CLAIM_BATCH, CLAIM_BATCH // 2)
    times = []
    for _ in range(DUE // CLAIM_BATCH):
        t = time.perf_counter()
        async with engine.connect() as conn:
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            batch = await job_claim_batch(
                conn, BENCH_KEY_RING, OWNER, CLAIM_BATCH, 60.0, held, 600.0, shares.claim_shares()
            )
        times.append(time.perf_counter() - t)
        if not batch.jobs:
            break
    times.sort()
    return round(times[len(times) // 2] * 1000, 3)


async def _phase(
    label: str,
    engine: AsyncEngine,
    url: str,
    key: str,
    tenant_id: Any,
    target_id: Any,
    held: Any,
    args: argparse.Namespace,
) -> dict[str, Any]:
    phase = {
        "quota_read_ms": await _timed_ms(engine, tenant_count_active_jobs, tenant_id, 21),
        "count_ms": await _timed_ms(engine, tenant_count_active_jobs_exactly, tenant_id, 5),
        **await _creates(engine, url, key, target_id, args.seconds),
        "claim_ms_per_batch": await _claims(engine, target_id, held),
    }
    print(f"{label}: {phase}", flush=True)
    return phase


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    database = BenchDatabase(args.database_url)
    async with database as url:
        engine = await migrated_engine(url, pool_size=CONCURRENCY + 2)
        try:
            target_id = await target_in_store(engine, "http://127.0.0.1:9/unused")
            async with engine.begin() as conn:
                tenant_id = await tenant_ensure(conn, "default")
                key = await api_key_create(conn, tenant_id)
                held = await partition_acquire(conn, OWNER, 256, 3600.0)
            empty = await _phase("empty", engine, url, key, tenant_id, target_id, held, args)
            t = time.perf_counter()
            async with engine.begin() as conn:
                await jobs_insert_series(conn, target_id, args.waiting, FAR_FUTURE, 1.0)
                await jobs_insert_series(conn, target_id, args.finished, time.time() - 86400, 0.0, state="succeeded")
            async with engine.begin() as conn:
                await tenant_count_active_jobs(conn, tenant_id)  # folds the load's deltas once
            async with engine.connect() as conn:
                await conn.execution_options(isolation_level="AUTOCOMMIT")
                await conn.execute(text("VACUUM ANALYZE jobs"))
                await conn.execute(text("VACUUM ANALYZE tenant_job_deltas"))
            load_s = round(time.perf_counter() - t, 1)
            print(f"loaded {args.waiting} waiting and {args.finished} finished jobs in {load_s} s", flush=True)
            loaded = await _phase("loaded", engine, url, key, tenant_id, target_id, held, args)
        finally:
            await engine.dispose()

    return {
        "bench": "quota_scale",
        "database": database.kind,
        "waiting": args.waiting,
        "finished": args.finished,
        "load_s": load_s,
        "empty": empty,
        "loaded": loaded,
        "ratio_loaded_to_empty": {
            name: ratio(loaded.get(name), empty.get(name), 2)
            for name in ("quota_read_ms", "count_ms", "create_p99_ms", "pg_us_per_create", "claim_ms_per_batch")
        },
    }


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--waiting", type=positive_int, default=5_000_000, help="waiting jobs (5000000)")
    parser.add_argument("--finished", type=positive_int, default=1_000_000, help="finished jobs (1000000)")
    parser.add_argument("--seconds", type=float, default=5.0, help="of single creates per phase (5)")
    add_database_url_arg(parser)
    return parse_args(parser, argv, smoke={"waiting": 2000, "finished": 500, "seconds": 0.5})


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    result = run_bench("cronhook-quota-scale-", lambda workdir: asyncio.run(run(args, workdir)))
    ratios = result["ratio_loaded_to_empty"]
    print(
        f"{result['waiting']} waiting + {result['finished']} finished vs empty: quota read x{ratios['quota_read_ms']}"
        f" (count x{ratios['count_ms']}), create p99 x{ratios['create_p99_ms']}, claim x{ratios['claim_ms_per_batch']}"
    )
    print_result(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
