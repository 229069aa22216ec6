"""What each role's process costs before it does any work (issue 31 item 4): one `cronhook`
process per role (scheduler, reaper, api) on a fresh, migrated database, started --rounds
times (3), each measured once it answers /healthz and has idled --idle-s (5): the CPU its
start-up took (imports, settings, the database's first round trips) and its resident memory
then. The database is migrated first and the roles start with CRONHOOK_AUTO_MIGRATE=false,
as behind a deployment's `cronhook migrate` step; with --auto-migrate they start with the
default (migrations on), so each finds the schema current itself. A scheduler is started
with --processes 1, so the figure is one scheduler process.

Reported per role: the median and the spread over the rounds; JSON on the last line. Also per
role, `libraries_rss_mb`: the resident memory of a fresh interpreter that imports only the
third-party modules (neither the standard library's nor cronhook's) the role loads: those its
modules import, and uvloop and uvicorn's protocol modules, which it loads once running. It is
the floor under the role's figure for as long as it runs on those libraries: what is above it
is cronhook's own code, data and connections.

    .venv/bin/python bench/footprint.py
    .venv/bin/python bench/footprint.py --cronhook-bin /tmp/other-tree/.venv/bin/cronhook
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
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
# What each role's process imports by the time it idles (app/cli.py, app/services/startup.py),
# with what it loads once running: uvloop (app/event_loop.py), and uvicorn's protocol and
# lifespan modules for the API.
RUNNING = "uvloop"
ROLE_MODULES = {
    "scheduler": f"app.cli app.runtime app.services.startup app.services.scheduler app.services.backlog {RUNNING}",
    "reaper": f"app.cli app.runtime app.services.startup app.services.reaper {RUNNING}",
    "api": f"app.cli app.runtime app.services.startup app.serve app.api.app {RUNNING} "
    "uvicorn.protocols.http.httptools_impl uvicorn.lifespan.on",
}
# The third-party modules: neither the standard library's nor cronhook's.
LIBRARIES_OF = """
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
own = set(sys.stdlib_module_names) | set(sys.builtin_module_names) | {"app", "__main__", "_distutils_hack"}
print(json.dumps(sorted(n for n in list(sys.modules) if n.split(".")[0] not in own)))
"""
# A few names in sys.modules are not importable by name (`__mp_main__`, Cython's runtime
# modules, attributes that extensions register as modules); their packages load them.
# A tree with app/db/async_engine.py loads SQLAlchemy's asyncio package without its __init__
# (and so without the ORM); the floor loads it the same way, or importing the package by name
# would bring the ORM back.
RSS_AFTER_IMPORTING = """
import importlib, sys
try:
    import app.db.async_engine
except ImportError:
    pass
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except ImportError:
        pass
print(int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) / 1024)
"""


def libraries_rss_mb(python: str, role: str) -> float | None:
    """The RSS of a fresh `python` that imports the third-party modules `role` loads; None when
    that tree cannot say (one without a module named in ROLE_MODULES)."""

    def run(script: str, *names: str) -> str:
        # -P: the working directory's `app` must not stand in for the measured tree's.
        done = subprocess.run(
            [python, "-P", "-c", script, *names], capture_output=True, text=True, check=True, timeout=120
        )
        return done.stdout.splitlines()[-1]

    try:
        libraries = json.loads(run(LIBRARIES_OF, *ROLE_MODULES[role].split()))
        return round(float(run(RSS_AFTER_IMPORTING, *libraries)), 1)
    except (subprocess.SubprocessError, ValueError, IndexError) as exc:
        stderr = getattr(exc, "stderr", "") or ""
        print(f"{role}: its libraries' RSS not measured: {type(exc).__name__} {stderr[-300:]}", file=sys.stderr)
        return None


def python_of(cronhook_bin: str) -> str:
    """The interpreter of the tree whose `cronhook` is measured: this venv's for `cronhook`
    (as Service runs it), else the one the given executable's first line names."""
    if cronhook_bin == "cronhook":
        return sys.executable
    found = shutil.which(cronhook_bin)
    if found is not None:
        with open(found, "rb") as script:
            first = script.readline().decode(errors="replace")
        if first.startswith("#!") and len(first.split()) == 1:
            return first[2:].strip()
    return str(Path(cronhook_bin).parent / "python")


def measure_role(args: argparse.Namespace, url: str, workdir: Path, role: str, round_no: int) -> dict[str, float]:
    # Migrated beforehand, as a deployment's `cronhook migrate` step does (or by the bench
    # first, and each role checks the schema at start, as by default).
    env = {"CRONHOOK_AUTO_MIGRATE": "true" if args.auto_migrate else "false"}
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
    result: dict[str, Any] = {
        "bench": "footprint",
        "rounds": args.rounds,
        "idle_s": args.idle_s,
        "auto_migrate": args.auto_migrate,
    }
    for role, runs in figures.items():
        result[role] = {
            "rss_mb": summary([r["rss_mb"] for r in runs], 1),
            "start_cpu_s": summary([r["cpu_s"] for r in runs], 2),
            "ready_s": summary([r["ready_s"] for r in runs], 2),
            "libraries_rss_mb": libraries_rss_mb(python_of(args.cronhook_bin), role),
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
    parser.add_argument(
        "--auto-migrate", action="store_true", help="start the roles with migrations on (the default deployment)"
    )
    args = parse_args(parser, argv, {"rounds": 1, "idle_s": 0.5})
    print_result(run_bench("chfp", lambda workdir: asyncio.run(run(args, workdir))))


if __name__ == "__main__":
    main()
