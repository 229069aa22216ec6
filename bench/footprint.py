"""What each role's process costs before it does any work (issue 31 item 4): one `cronhook`
process per role (scheduler, reaper, api) on a fresh, migrated database, started --rounds
times (3), each measured once it answers /healthz and has idled --idle-s (5): the CPU its
start-up took (imports, settings, the database's first round trips) and its resident memory
then. The database is migrated first and the roles start with CRONHOOK_AUTO_MIGRATE=false,
as behind a deployment's `cronhook migrate` step. A scheduler is started with --processes 1,
so the figure is one scheduler process.

Reported per role: the median and the spread over the rounds; JSON on the last line. Also per
role, `libraries_rss_mb`: the resident memory of a fresh interpreter that imports only the
third-party modules (those under site-packages) the role's modules load, and none of
cronhook's. It is the floor under the role's figure for as long as it runs on those libraries:
what is above it is cronhook's own code, data and connections.

    .venv/bin/python bench/footprint.py
    .venv/bin/python bench/footprint.py --cronhook-bin /tmp/other-tree/.venv/bin/cronhook
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
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
# What each role's process imports by the time it idles (app/cli.py, app/services/startup.py).
ROLE_MODULES = {
    "scheduler": "app.cli app.runtime app.services.startup app.services.scheduler app.services.backlog",
    "reaper": "app.cli app.runtime app.services.startup app.services.reaper",
    "api": "app.cli app.runtime app.services.startup app.serve app.api.app",
}
LIBRARIES_OF = """
import importlib, json, sys, sysconfig
for name in sys.argv[1:]:
    importlib.import_module(name)
site = sysconfig.get_paths()["purelib"]
print(json.dumps(sorted(n for n, m in list(sys.modules.items())
                        if (getattr(m, "__file__", None) or "").startswith(site) and not n.startswith("app."))))
"""
RSS_AFTER_IMPORTING = """
import importlib, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
print(int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) / 1024)
"""


def libraries_rss_mb(python: str, role: str) -> float:
    """The RSS of a fresh `python` that imports the third-party modules `role` loads."""

    def run(script: str, *names: str) -> str:
        lines = subprocess.run([python, "-P", "-c", script, *names], capture_output=True, text=True, check=True)
        return lines.stdout.splitlines()[-1]

    libraries = json.loads(run(LIBRARIES_OF, *ROLE_MODULES[role].split()))
    return float(run(RSS_AFTER_IMPORTING, *libraries))


def python_of(cronhook_bin: str) -> str:
    """The interpreter of the tree whose `cronhook` is measured: this venv's for `cronhook`
    (as Service runs it), else the one beside the given executable."""
    if cronhook_bin == "cronhook":
        return sys.executable
    return str(Path(cronhook_bin).parent / "python")


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
            "libraries_rss_mb": round(libraries_rss_mb(python_of(args.cronhook_bin), role), 1),
        }
        print(
            f"{role:>9}: RSS {result[role]['rss_mb']['median']} MB (its libraries alone: "
            f"{result[role]['libraries_rss_mb']} MB), start-up CPU "
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
