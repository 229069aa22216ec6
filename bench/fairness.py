"""Noisy neighbour: how late one tenant's jobs are while another tenant's receivers hang.

Per phase, on a fresh database with one `--cronhook-cmd` (default `cronhook scheduler`,
default settings): a noisy tenant's --noisy-jobs (250) one-off jobs, all due at once and
with one attempt each, go to the receiver's /noisy, which holds every request --hang-s (30)
seconds before answering (targets with the largest timeout, 30 s), spread over
`noisy_targets` targets; from one second later, a quiet tenant's --quiet-jobs (200) jobs fall
due --quiet-step-s (0.05) apart, to /quiet, which answers at once. Lateness per quiet request
= arrival - its `cronhook-scheduled-for` header; p50/p99/max in ms. Also: the most noisy
requests held at once, and how many noisy requests were answered before the last quiet one
arrived (0: every quiet job went while the noisy tenant's first deliveries still hung).

Phases: the noisy tenant's jobs on one target (the issue's scenario) and on five (no target
reaches the default per-target cap, the tenant share binds).

    .venv/bin/python bench/fairness.py --database-url postgresql://postgres@127.0.0.1:5432/postgres
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness import (
    BenchDatabase,
    Receiver,
    Reply,
    Service,
    add_database_url_arg,
    add_service_args,
    jobs_insert_series,
    lateness_s,
    migrated_engine,
    ms_summary,
    parse_args,
    parse_env,
    positive_int,
    print_result,
    run_bench,
    target_in_store,
    wait_partitions_owned,
)
from sqlalchemy.ext.asyncio import AsyncEngine

TARGET_TIMEOUT_S = 30.0  # the largest a target may have


async def add_jobs(
    engine: AsyncEngine, tenant: str, url: str, targets: int, count: int, first_due: float, step_s: float
) -> None:
    """`count` jobs of `tenant`, one attempt each, spread over `targets` new targets for `url`."""
    for index in range(targets):
        target_id = await target_in_store(engine, url, tenant, f"{tenant}-{index}", TARGET_TIMEOUT_S)
        share = count // targets + (1 if index < count % targets else 0)
        async with engine.begin() as conn:
            await jobs_insert_series(conn, target_id, share, first_due, step_s, max_attempts=1)


async def phase(args: argparse.Namespace, noisy_targets: int, workdir: Path) -> dict[str, Any]:
    routes = {"/noisy": Reply(slow=1.0, slow_s=args.hang_s), "/quiet": Reply()}
    async with BenchDatabase(args.database_url) as url, Receiver(workdir, routes) as receiver:
        engine = await migrated_engine(url)
        service = Service(args.cronhook_cmd, url, workdir / f"cronhook-{noisy_targets}.log", parse_env(args.env))
        try:
            await asyncio.to_thread(service.start)
            await wait_partitions_owned(engine, service.check_alive, args.settle_s)
            start = time.time()
            if noisy_targets > 0:
                await add_jobs(engine, "noisy", receiver.url + "/noisy", noisy_targets, args.noisy_jobs, start, 0.0)
            quiet_first = start + 1.0
            await add_jobs(engine, "quiet", receiver.url + "/quiet", 1, args.quiet_jobs, quiet_first, args.quiet_step_s)
            deadline = quiet_first + args.quiet_jobs * args.quiet_step_s + args.hang_s + 30
            while (stats := await receiver.stats()).per_path.get("/quiet", 0) < args.quiet_jobs:
                service.check_alive()
                if time.time() > deadline:
                    break
                await asyncio.sleep(0.1)
            receipts = await receiver.receipts()
        finally:
            await asyncio.to_thread(service.stop)
            await engine.dispose()
    quiet = [r for r in receipts if r.path == "/quiet"]
    quiet_done = max((r.arrived for r in quiet), default=time.time())
    late = ms_summary(lateness_s(quiet))
    return {
        "noisy_targets": noisy_targets,
        "noisy_jobs": args.noisy_jobs if noisy_targets else 0,
        "hang_s": args.hang_s,
        "quiet_jobs": args.quiet_jobs,
        "quiet_delivered": len(quiet),
        "late_ms_p50": late["p50"],
        "late_ms_p99": late["p99"],
        "late_ms_max": late["max"],
        "noisy_max_in_flight": stats.most_held.get("/noisy", 0),
        "noisy_answered_before_quiet_done": sum(
            1 for r in receipts if r.path == "/noisy" and r.answered is not None and r.answered <= quiet_done
        ),
    }


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    result: dict[str, Any] = {"bench": "fairness", "cmd": args.cronhook_cmd, "env": args.env, "phases": []}
    for noisy_targets in args.noisy_targets:
        fig = await phase(args, noisy_targets, workdir)
        print(
            f"noisy tenant on {noisy_targets} hanging target(s): quiet lateness p50 {fig['late_ms_p50']} ms, "
            f"p99 {fig['late_ms_p99']} ms, max {fig['late_ms_max']} ms ({fig['quiet_delivered']}/"
            f"{fig['quiet_jobs']}); noisy held at most {fig['noisy_max_in_flight']} at once, "
            f"{fig['noisy_answered_before_quiet_done']} answered meanwhile"
        )
        result["phases"].append(fig)
    return result


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--noisy-jobs", type=positive_int, default=250)
    parser.add_argument(
        "--noisy-targets", type=int, nargs="+", default=[1, 5], help="one phase each (0: no noisy tenant, a baseline)"
    )
    parser.add_argument("--hang-s", type=float, default=30.0, help="how long the noisy receiver holds a request")
    parser.add_argument("--quiet-jobs", type=positive_int, default=200)
    parser.add_argument("--quiet-step-s", type=float, default=0.05, help="seconds between quiet due times")
    add_database_url_arg(parser)
    add_service_args(parser, "cronhook scheduler")
    smoke = {"noisy_jobs": 10, "noisy_targets": [2], "hang_s": 1.0, "quiet_jobs": 5, "quiet_step_s": 0.05}
    return parse_args(parser, argv, smoke | {"settle_s": 0.2, "cronhook_cmd": "cronhook scheduler --processes 1"})


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    result = run_bench("cronhook-fairness-", lambda workdir: asyncio.run(run(args, workdir)))
    print_result(result)
    return 0 if all(p["quiet_delivered"] == p["quiet_jobs"] for p in result["phases"]) else 1


if __name__ == "__main__":
    sys.exit(main())
