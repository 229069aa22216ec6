"""Pause, hold and drain: `--jobs` one-off jobs (default 10,000; the issue's figure is
100,000) of one target with `rate_per_s` `--rate` (250), held by a pause while they fall due,
then resumed (`on_resume` deliver_all) and drained, through `--cronhook-cmd` (default
`cronhook up`: API, scheduler and reaper) to the bench's receiver.

The jobs are written in one set-based INSERT before they fall due (seeding is not measured),
then POST /v1/targets/{id}/pause holds them; they fall due while held (nothing may arrive);
POST /v1/targets/{id}/resume releases them, spread at the target's rate. Figures: how long
the pause and the resume requests took, the drain's rate (deliveries per second from the
first to the last) against the target's, and, from the receiver's log, occurrences lost (a
job with no delivery) and doubled (a webhook-id delivered twice). JSON on the last line.

    .venv/bin/python bench/drain.py
    .venv/bin/python bench/drain.py --jobs 100000 --rate 500
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
    Service,
    add_database_url_arg,
    add_service_args,
    jobs_insert_series,
    jobs_unfinished,
    migrated_engine,
    parse_args,
    parse_env,
    positive_int,
    print_result,
    run_bench,
    wait_partitions_owned,
)
from sqlalchemy import text


def _api(service: Service, method: str, path: str, body: Any = None) -> tuple[dict[str, Any], float]:
    """One request that must succeed: its body, and how long it took."""
    started = time.monotonic()
    status, answer = service.api(method, path, body, timeout_s=600)
    took = time.monotonic() - started
    if status != 200:
        raise RuntimeError(f"{method} {path} answered {status}: {str(answer)[:300]}")
    return answer, took


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    total = args.jobs
    async with BenchDatabase(args.database_url) as url, Receiver(workdir) as receiver:
        engine = await migrated_engine(url)
        service = Service(args.cronhook_cmd, url, workdir / "cronhook.log", parse_env(args.env))
        try:
            await asyncio.to_thread(service.start)
            await wait_partitions_owned(engine, service.check_alive, args.settle_s)
            target = await asyncio.to_thread(service.create_target, receiver.url + "/drain")
            await asyncio.to_thread(_api, service, "PATCH", f"/v1/targets/{target}", {"rate_per_s": args.rate})
            due = time.time() + args.lead_s
            seeding = time.monotonic()
            async with engine.begin() as conn:
                await jobs_insert_series(conn, target, total, due, 0.0)
            async with engine.connect() as conn:
                await conn.execute(text("ANALYZE jobs"))
            seed_s = time.monotonic() - seeding
            paused, pause_s = await asyncio.to_thread(_api, service, "POST", f"/v1/targets/{target}/pause")
            if time.time() > due:
                raise SystemExit(
                    f"seeding and pausing took past the jobs' due time: raise --lead-s (seeded in {seed_s:.1f} s)"
                )
            # Held through their due time and then some: nothing may arrive.
            while time.time() < due + args.hold_s:
                service.check_alive()
                await asyncio.sleep(0.1)
            while_paused = (await receiver.stats()).requests
            resumed, resume_s = await asyncio.to_thread(_api, service, "POST", f"/v1/targets/{target}/resume", {})
            released_at = time.time()
            deadline = released_at + args.timeout_s
            while (stats := await receiver.stats()).distinct < total and time.time() < deadline:
                service.check_alive()
                await asyncio.sleep(0.1)
            # A little longer, for a delivery made twice to show.
            await asyncio.sleep(args.quiet_s)
            receipts = await receiver.receipts()
            unfinished = await jobs_unfinished(engine)
        finally:
            await asyncio.to_thread(service.stop)
            await engine.dispose()
    arrivals = sorted(r.arrived for r in receipts)
    distinct = len({r.webhook_id for r in receipts})
    drain_s = arrivals[-1] - arrivals[0] if len(arrivals) > 1 else None
    drain_per_s = round((len(arrivals) - 1) / drain_s, 1) if drain_s else None
    return {
        "bench": "drain",
        "cmd": args.cronhook_cmd,
        "jobs": total,
        "target_rate_per_s": args.rate,
        "seed_s": round(seed_s, 2),
        "held": paused["held"],
        "pause_request_s": round(pause_s, 3),
        "delivered_while_paused": while_paused,
        "released": resumed["released"],
        "resume_request_s": round(resume_s, 3),
        "first_delivery_after_resume_s": round(arrivals[0] - released_at, 3) if arrivals else None,
        "drain_s": round(drain_s, 2) if drain_s else None,
        "drain_per_s": drain_per_s,
        "drain_vs_target_rate": round(drain_per_s / args.rate, 3) if drain_per_s else None,
        "requests": stats.requests,
        "delivered": distinct,
        "lost": total - distinct,
        "doubled": len(receipts) - distinct,
        "unfinished_jobs": unfinished,
    }


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=positive_int, default=10_000, help="held jobs (10,000)")
    parser.add_argument("--rate", type=float, default=250.0, help="the target's rate_per_s (250)")
    parser.add_argument("--lead-s", type=float, default=10.0, help="seconds from seeding to the jobs' due time")
    parser.add_argument("--hold-s", type=float, default=3.0, help="seconds held past their due time")
    parser.add_argument("--timeout-s", type=float, default=900.0, help="give up this long after the resume")
    parser.add_argument("--quiet-s", type=float, default=2.0, help="wait this long after the last delivery")
    add_database_url_arg(parser)
    add_service_args(parser, "cronhook up")
    smoke = {"jobs": 50, "rate": 100.0, "lead_s": 4.0, "hold_s": 0.5, "timeout_s": 30.0, "quiet_s": 0.3}
    return parse_args(parser, argv, smoke | {"settle_s": 0.2})


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    result = run_bench("cronhook-drain-", lambda workdir: asyncio.run(run(args, workdir)))
    print(
        f"{result['jobs']} held jobs: paused in {result['pause_request_s']} s, released in "
        f"{result['resume_request_s']} s, drained at {result['drain_per_s']}/s against a target rate of "
        f"{result['target_rate_per_s']}/s; lost {result['lost']}, doubled {result['doubled']}"
    )
    print_result(result)
    clean = result["lost"] == 0 and result["doubled"] == 0 and result["delivered_while_paused"] == 0
    return 0 if clean and result["held"] == result["jobs"] == result["released"] else 1


if __name__ == "__main__":
    sys.exit(main())
