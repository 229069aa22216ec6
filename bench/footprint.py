"""What each role's process costs before it does any work (issue 31 item 4): one `cronhook`
process per role (scheduler, reaper, api) on a fresh, migrated database, started --rounds
times (3), each measured once it answers /healthz and has idled --idle-s (5): the CPU its
start-up took (imports, settings, the database's first round trips) and its resident memory
then. The database is migrated first and the roles start with CRONHOOK_AUTO_MIGRATE=false,
as behind a deployment's `cronhook migrate` step. A scheduler is started with --processes 1,
so the figure is one scheduler process.

Reported per role: the median and the spread over the rounds; JSON on the last line.

    .venv/bin/python bench/footprint.py
    .venv/bin/python bench/footprint.py --cronhook-bin /tmp/other-tree/.venv/bin/cronhook
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness import (
    BenchDatabase,
    Service,
    add_database_url_arg,
    migrated_engine,
    parse_args,
    positive_int,
    print_result,
    run_bench,
)

ROLES = {"scheduler": "scheduler --processes 1", "reaper": "reaper", "api": "api"}


def measure_role(args: argparse.Namespace, url: str, workdir: Path, role: str, round_no: int) -> dict[str, float]:
    # Migrated beforehand, as a deployment's `cronhook migrate` step does.
    env = {"CRONHOOK_AUTO_MIGRATE": "false"}
    service = Service(f"{args.cronhook_bin} {ROLES[role]}", url, workdir / f"{role}-{round_no}.log", env)
    started = time.monotonic()
    service.start()
    ready_s = time.monotonic() - started
    time.sleep(args.idle_s)
    try:
        return {"ready_s": ready_s, "cpu_s": service.cpu_s(), "rss_mb": service.rss_bytes() / 2**20}
    finally:
        service.stop()


def summary(values: Sequence[float], digits: int) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
    }


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    async with BenchDatabase(args.database_url) as url:
        engine = await migrated_engine(url)
        await engine.dispose()
        figures: dict[str, list[dict[str, float]]] = {role: [] for role in ROLES}
        for round_no in range(args.rounds):
            for role in ROLES:
                figures[role].append(await asyncio.to_thread(measure_role, args, url, workdir, role, round_no))
    result: dict[str, Any] = {"bench": "footprint", "rounds": args.rounds, "idle_s": args.idle_s}
    for role, runs in figures.items():
        result[role] = {
            "rss_mb": summary([r["rss_mb"] for r in runs], 1),
            "start_cpu_s": summary([r["cpu_s"] for r in runs], 2),
            "ready_s": summary([r["ready_s"] for r in runs], 2),
        }
        print(
            f"{role:>9}: RSS {result[role]['rss_mb']['median']} MB, start-up CPU "
            f"{result[role]['start_cpu_s']['median']} s, ready in {result[role]['ready_s']['median']} s"
        )
    return result


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_database_url_arg(parser)
    parser.add_argument(
        "--cronhook-bin", default="cronhook", help="the cronhook executable (default: this checkout's venv)"
    )
    parser.add_argument("--rounds", type=positive_int, default=3)
    parser.add_argument("--idle-s", type=float, default=5.0)
    args = parse_args(parser, argv, {"rounds": 1, "idle_s": 0.5})
    print_result(run_bench("chfp", lambda workdir: asyncio.run(run(args, workdir))))


if __name__ == "__main__":
    main()
