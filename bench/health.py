"""Schedule health's cost to the reaper: one health pass (app/services/health_watch.py, the
watch's edges and the gauge by health) over `--jobs` recurring jobs (default 100,000).

The mix, per `--jobs`: most are healthy and set no `expect` (80 %), some set their own
deadline and are healthy (10 %), some are failing and already reported (5 %), some are in a
failure streak below their threshold (3 %), a few are paused (2 %). The first pass reports
the jobs seeded as failing but not yet reported (`--new-failing`, default 1,000: two batches
of the default 500); the passes after it find no edge, the steady state, and are timed
`--passes` times (default 7): each a pass's wall time in ms as the reaper spends it
(health_watch_once). The gauge by health is sampled once a minute, not every pass: its scan
is timed apart (`gauge_sample_ms`). Then the passes again with a tenant default deadline
(tenant_limits.expect_success_within_s), which makes the watch look at the jobs outside its
index too. JSON on the last line.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

from harness import (
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

from app.domain.health import HealthDefaults
from app.services.health_watch import health_watch_once
from app.settings import Settings
from app.store.health import job_count_by_health

# Recurring jobs of one target, `kind` deciding their health record (set-based: seeding is
# not measured). Fire times every minute, the next one ahead; last success a few minutes ago.
_SEED = text(
    """
    INSERT INTO jobs (id, tenant_id, target_id, partition, schedule_kind, every_s, schedule_anchor_at,
                      scheduled_for, occurrence_id, payload, state, run_at, attempt, max_attempts,
                      backoff_base_s, backoff_max_s, occurrences_run, last_success_at, last_failure_at,
                      consecutive_failures, expect_success_within_s, expect_max_consecutive_failures,
                      health_alert, created_at)
    SELECT gen_random_uuid(), t.tenant_id, t.id, (g % 256), 'interval', 60, now() - interval '1 day',
           now() + (g % 60) * interval '1 second', gen_random_uuid(), '{"seq": 1}'::jsonb,
           CAST(CASE WHEN :kind = 'paused' THEN 'paused' ELSE 'scheduled' END AS job_state),
           CASE WHEN :kind = 'paused' THEN NULL ELSE now() + (g % 60) * interval '1 second' END,
           0, 5, 2, 600, 1000,
           now() - (g % 300) * interval '1 second',
           CASE WHEN :failures > 0 THEN now() - interval '1 minute' END,
           :failures, :within, :most, :alert, now() - interval '1 day'
    FROM targets t, generate_series(1, :n) AS g
    WHERE t.id = :target
    """
)
_TENANT_DEADLINE = text(
    """
    INSERT INTO tenant_limits (tenant_id, expect_success_within_s) SELECT id, 86400 FROM tenants
    ON CONFLICT (tenant_id) DO UPDATE SET expect_success_within_s = 86400
    """
)
# (share of --jobs, kind, consecutive_failures, expect_success_within_s, expect_max, alert)
_MIX = (
    (0.80, "healthy", 0, None, None, None),
    (0.10, "deadline", 0, 3600, 3, None),
    (0.05, "failing", 5, None, None, "failing"),
    (0.03, "streak", 1, None, 3, None),
    (0.02, "paused", 0, None, None, None),
)


async def seed(engine: AsyncEngine, args: argparse.Namespace) -> None:
    target = await target_in_store(engine, "https://example.com/", "health", "t")
    async with engine.begin() as conn:
        for share, kind, failures, within, most, alert in _MIX:
            params = {"kind": kind, "failures": failures, "within": within, "most": most, "alert": alert}
            await conn.execute(_SEED, {**params, "n": int(args.jobs * share), "target": target})
        # Failing by their record (the default threshold is 1) but not reported yet.
        params = {"kind": "new", "failures": 2, "within": None, "most": None, "alert": None}
        await conn.execute(_SEED, {**params, "n": args.new_failing, "target": target})
    async with engine.begin() as conn:
        await conn.execute(text("ANALYZE jobs"))
        await conn.execute(text("ANALYZE tenant_limits"))


async def timed_pass(engine: AsyncEngine, defaults: HealthDefaults, limit: int) -> dict[str, float]:
    """One pass as the reaper makes it (the gauge sampled in the first only), and the
    gauge's sample timed alone."""
    started = time.perf_counter()
    await health_watch_once(engine, defaults, limit)
    whole = time.perf_counter() - started
    started = time.perf_counter()
    async with engine.connect() as conn:
        await job_count_by_health(conn)
    gauge = time.perf_counter() - started
    return {"pass_ms": whole * 1000, "gauge_ms": gauge * 1000}


def summary(passes: list[dict[str, float]], key: str) -> dict[str, float]:
    values = sorted(p[key] for p in passes)
    return {"min": round(values[0], 1), "median": round(statistics.median(values), 1), "max": round(values[-1], 1)}


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    database = BenchDatabase(args.database_url)
    settings = Settings()
    defaults = HealthDefaults(settings.expect_max_consecutive_failures, settings.expect_success_within_s)
    async with database as url:
        engine = await migrated_engine(url)
        try:
            await seed(engine, args)
            started = time.perf_counter()
            reported = await health_watch_once(engine, defaults, settings.reaper_batch_size)
            first_ms = (time.perf_counter() - started) * 1000
            steady = [await timed_pass(engine, defaults, settings.reaper_batch_size) for _ in range(args.passes)]
            async with engine.connect() as conn:
                by_health = await job_count_by_health(conn)
            async with engine.begin() as conn:
                await conn.execute(_TENANT_DEADLINE)
            tenant_deadline = [await timed_pass(engine, defaults, settings.reaper_batch_size) for _ in range(3)]
        finally:
            await engine.dispose()
    return {
        "bench": "health",
        "jobs": args.jobs + args.new_failing,
        "mix": {kind: share for share, kind, *_ in _MIX},
        "first_pass_reported": reported,
        "first_pass_ms": round(first_ms, 1),
        "steady_pass_ms": summary(steady, "pass_ms"),
        "gauge_sample_ms": summary(steady, "gauge_ms"),
        "tenant_deadline_pass_ms": summary(tenant_deadline, "pass_ms"),
        "by_health": {health.value: count for health, count in by_health.items()},
        "under_100_ms": summary(steady, "pass_ms")["median"] < 100,
        "database": database.kind,
        "measured_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=positive_int, default=100_000, help="recurring jobs (the mix above)")
    parser.add_argument("--new-failing", type=positive_int, default=1_000, help="failing jobs not yet reported")
    parser.add_argument("--passes", type=positive_int, default=7, help="steady-state passes timed")
    add_database_url_arg(parser)
    return parse_args(parser, argv, {"jobs": 500, "new_failing": 10, "passes": 2})


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    result = run_bench("cronhook-health-", lambda _: asyncio.run(bench(args)))
    print_result(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
