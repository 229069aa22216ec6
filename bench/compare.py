"""cronhook next to the peers' yardsticks: a burst of N webhook jobs all due at one instant,
drained by the ceiling pipeline, by procrastinate and by cronhook in the same run
(../shared/peers/side_by_side.py, its `extra(receiver_url)` contract).

cronhook runs as `--cronhook-cmd` (default `cronhook up`, its defaults otherwise) on the
harness's embedded PostgreSQL (the database named by PEERS_EXTRA_DSN), with a bootstrap API
key. The target is created through the API; the N jobs through `POST /v1/jobs/batch` when the
service has it, else with one set-based INSERT (generate_series) straight into the database:
single creates through the API run at ~150/s on this box and would take longer than the
drain itself. Every job is due at the same instant, after the creation ends.

Reported, from the receiver's own log (side_by_side's figures): deliveries/s, lateness,
duplicates (requests beyond the first per webhook-id) and lost (jobs never received), the
ratio to the ceiling (mean of the bracketing runs) and to procrastinate; from the cronhook
processes: CPU ms per delivery between the due instant and the last receipt (every cronhook
process, so the API and reaper of `cronhook up` too; PostgreSQL's CPU is the harness's
postgres_s). --profile DIR records py-spy over that same window.

    .venv/bin/python bench/compare.py                  # burst of 5,000
    .venv/bin/python bench/compare.py --jobs 50000     # burst of 50,000
    .venv/bin/python bench/compare.py --cronhook-cmd "cronhook up --processes 2"
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from harness import (
    Service,
    add_service_args,
    add_yardstick_args,
    create_jobs_batch,
    jobs_insert_series,
    load_peer,
    parse_args,
    parse_env,
    positive_int,
    print_result,
    run_bench,
    target_for,
    tree_cpu_by_process,
    tree_cpu_s,
    wait_jobs_finished,
    wait_partitions_owned,
)
from profiles import brief, print_profile, profiled
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.engine import create_engine

SETTLE_TIMEOUT_S = 30.0


def receiver_count(receiver_url: str) -> int:
    try:
        with urllib.request.urlopen(receiver_url + "/__receiver/count", timeout=5) as response:
            return int(json.loads(response.read())["count"])
    except (OSError, ValueError, KeyError):
        return 0


async def create_burst(
    args: argparse.Namespace, service: Service, engine: AsyncEngine, target_id: uuid.UUID
) -> tuple[str, float]:
    """The N jobs, due at one instant after their creation: (how they were created, due)."""
    n, mode = args.jobs, args.create
    # Due after the creation: --lead-s plus a generous guess at its speed.
    due = time.time() + args.lead_s + n / (20_000 if mode == "sql" else 2_000)
    if mode in ("auto", "batch"):
        if service.serves_http and await asyncio.to_thread(create_jobs_batch, service, target_id, n, due, 0.0):
            mode = "batch"
        elif mode == "batch":
            raise RuntimeError("POST /v1/jobs/batch is not there (404/405)")
        else:
            mode = "sql"
            due = time.time() + args.lead_s + n / 20_000
    async with engine.begin() as conn:
        if mode == "sql":
            await jobs_insert_series(conn, target_id, n, due, 0.0)
        # Like the procrastinate peer: statistics for the backlog before it falls due.
        await conn.execute(text("ANALYZE jobs"))
    return mode, due


async def run_cronhook(args: argparse.Namespace, receiver_url: str) -> dict[str, Any]:
    """The `extra` callable's work: start cronhook, create the burst, wait for its delivery."""
    n: int = args.jobs
    dsn = os.environ["PEERS_EXTRA_DSN"]
    workdir = Path(tempfile.mkdtemp(prefix="cronhook-compare-"))
    service = Service(args.cronhook_cmd, dsn, workdir / "cronhook.log", parse_env(args.env))
    engine = create_engine(dsn, pool_size=2)
    report: dict[str, Any] = {}
    try:
        await asyncio.to_thread(service.start)
        await wait_partitions_owned(engine, service.check_alive, args.settle_s)
        target_id = await target_for(engine, service, receiver_url + "/hook")
        t_create = time.time()
        mode, due = await create_burst(args, service, engine, target_id)
        report.update(create=mode, create_s=round(time.time() - t_create, 3), created_before_due=time.time() < due)
        postmaster = await postmaster_pid(engine)
        await asyncio.sleep(max(0.0, due - time.time()))
        cpu0, pg_cpu0 = service.cpu_s(), tree_cpu_s(postmaster) if postmaster else 0.0
        by_process0 = tree_cpu_by_process(service.pid)
        with profiled(args.profile, f"compare-{n}", service.pid) as profile:
            deadline = time.monotonic() + args.deadline
            count = 0
            while time.monotonic() < deadline:
                service.check_alive()
                count = await asyncio.to_thread(receiver_count, receiver_url)
                if count >= n:
                    break
                await asyncio.sleep(0.05)
            cpu_s = service.cpu_s() - cpu0
            pg_cpu_s = (tree_cpu_s(postmaster) if postmaster else 0.0) - pg_cpu0
            by_process = tree_cpu_by_process(service.pid)
        if profile:
            report["profile"] = profile
        report.update(
            received=count,
            cpu_s=round(cpu_s, 2),
            cpu_ms_per_delivery=round(cpu_s * 1000 / max(count, 1), 3),
            postgres_cpu_ms_per_delivery=round(pg_cpu_s * 1000 / max(count, 1), 3),
            # Which process spent it (a process started during the drain counts from zero).
            cpu_ms_per_delivery_by_process={
                name: round((cpu - by_process0.get(name, 0.0)) * 1000 / max(count, 1), 3)
                for name, cpu in by_process.items()
            },
        )
        # Every outcome recorded, so the next run starts from a quiet database.
        report["unfinished_after"] = await wait_jobs_finished(engine, service.check_alive, SETTLE_TIMEOUT_S)
    finally:
        await asyncio.to_thread(service.stop)
        await engine.dispose()
        shutil.rmtree(workdir, ignore_errors=True)
    # cpu_s for the harness is 0: the cronhook processes were started and reaped here, so
    # their CPU is already in the harness's count of reaped children (system_s).
    return {"due": due, "name": "cronhook", "n": n, "cpu_s": 0.0, "cmd": args.cronhook_cmd, **report}


async def postmaster_pid(engine: AsyncEngine) -> int | None:
    """The PostgreSQL server's postmaster: the parent of this connection's backend."""
    async with engine.connect() as conn:
        backend = (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one()
    try:
        stat = await asyncio.to_thread(Path(f"/proc/{backend}/stat").read_text)
        return int(stat.rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None  # not on this machine


def make_extra(args: argparse.Namespace) -> Callable[[str], dict[str, Any]]:
    return lambda receiver_url: asyncio.run(run_cronhook(args, receiver_url))


def summarize(result: dict[str, Any], n: int) -> dict[str, Any]:
    systems = result["systems"]
    mine = systems.get("cronhook", {})
    distinct = mine.get("distinct") or 0
    peer = systems.get("procrastinate", {})
    ceilings = [fig["deliveries_per_s"] for name, fig in systems.items() if name.startswith("ceiling")]
    ratio_pq = None
    if mine.get("deliveries_per_s") and peer.get("deliveries_per_s"):
        ratio_pq = round(mine["deliveries_per_s"] / peer["deliveries_per_s"], 3)
    reported = mine.get("self_reported", {})
    return {
        "bench": "compare",
        "jobs": n,
        "cmd": reported.get("cmd"),
        "create": reported.get("create"),
        "cronhook_deliveries_per_s": mine.get("deliveries_per_s"),
        "ceiling_deliveries_per_s": ceilings,
        "procrastinate_deliveries_per_s": peer.get("deliveries_per_s"),
        "ratio_vs_ceiling": result["ratio_vs_ceiling"].get("cronhook"),
        "ratio_vs_procrastinate": ratio_pq,
        "ceiling_spread": result.get("ceiling_spread"),
        "duplicates": mine.get("duplicates"),
        "lost": n - distinct,
        "late_ms_p50": mine.get("late_ms_p50"),
        "late_ms_p99": mine.get("late_ms_p99"),
        "cpu_ms_per_delivery": reported.get("cpu_ms_per_delivery"),
        "postgres_cpu_ms_per_delivery": reported.get("postgres_cpu_ms_per_delivery"),
        "cpu_ms_per_delivery_by_process": reported.get("cpu_ms_per_delivery_by_process"),
        # Whole runs (set-up included), per delivery: the system's processes and PostgreSQL.
        "run_cpu_ms_per_delivery": {
            name: {
                "system": round(fig["cpu"]["system_s"] * 1000 / n, 3),
                "postgres": round(fig["cpu"]["postgres_s"] * 1000 / n, 3),
            }
            for name, fig in systems.items()
            if "cpu" in fig
        },
        "cpu": mine.get("cpu"),
        "box": result.get("box"),
    }


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=positive_int, default=5000, help="burst size (5000; 50000: the big one)")
    parser.add_argument(
        "--create",
        choices=("auto", "batch", "sql"),
        default="auto",
        help="how cronhook's jobs are created: POST /v1/jobs/batch when it exists (auto), or set-based SQL",
    )
    parser.add_argument("--systems", default="ceiling,procrastinate", help="the peers to run (side_by_side)")
    parser.add_argument("--deadline", type=float, default=300.0, help="seconds cronhook gets to deliver the burst")
    parser.add_argument("--lead-s", type=float, default=2.0, help="seconds from the creation to the due time (2)")
    parser.add_argument("--keep", action="store_true", help="keep the harness's work folder (receiver logs)")
    parser.add_argument("--json-out", help="also write the harness's full result to this file")
    add_service_args(parser, "cronhook up")
    add_yardstick_args(parser)
    smoke = {"jobs": 100, "systems": "", "deadline": 30.0, "lead_s": 0.5, "settle_s": 0.2}
    return parse_args(parser, argv, smoke | {"cronhook_cmd": "cronhook up --processes 1"})


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    side_by_side = load_peer("side_by_side", args.peers_dir)
    systems = tuple(s for s in args.systems.split(",") if s)
    result = run_bench(
        "cronhook-compare-",
        lambda _: side_by_side.run(args.jobs, extra=make_extra(args), systems=systems, keep=args.keep, quiet=True),
    )
    side_by_side.print_table(result)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2, default=str) + "\n")
    summary = summarize(result, args.jobs)
    profile = result["systems"].get("cronhook", {}).get("self_reported", {}).pop("profile", None)
    if profile:
        print_profile("cronhook during the burst", profile)
        summary["profile"] = brief(profile)
    ratio = (summary["ratio_vs_ceiling"] or {}).get("deliveries_per_s")
    print(
        f"cronhook: {summary['cronhook_deliveries_per_s']} deliveries/s = {ratio} x ceiling, "
        f"{summary['ratio_vs_procrastinate']} x procrastinate; duplicates {summary['duplicates']}, "
        f"lost {summary['lost']}; {summary['cpu_ms_per_delivery']} ms CPU per delivery (jobs created by "
        f"{summary['create']})"
    )
    print_result(summary)
    return 0 if summary["lost"] == 0 and not summary["duplicates"] else 1


if __name__ == "__main__":
    sys.exit(main())
