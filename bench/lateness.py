"""Steady-load lateness: how late cronhook delivers jobs that fall due one after another.

For each rate (default 100/s and 1,000/s: jobs due 10 ms and 1 ms apart) it creates
rate x --seconds one-off jobs due at first_due + i / rate, in one set-based INSERT
(generate_series) well before the first is due, and lets `--cronhook-cmd` (default
`cronhook up`) deliver them to the peers' fast receiver (../shared/peers/receiver.py, about
15 us of CPU per request, so the figures are the scheduler's). Lateness per request = receive
time - its `cronhook-scheduled-for` header (the dispatcher's; ISO 8601), from the receiver's
log; p50/p99/max, and duplicates (requests beyond the first per webhook-id).

The database is fresh (embedded in a temporary folder, or a scratch database on
--database-url's server, dropped at the end); cronhook migrates it and owns all partitions
before the first job is due.

With --from-start, it measures the first seconds instead: `--cronhook-cmd` is launched on a
fresh database and, as soon as /readyz says ready, --start-jobs (10,000: 1,000/s) jobs are written, due
evenly over the --start-window-s (10) seconds that begin --lead-s (2) later: while the
scheduler processes that started a moment apart settle their partitions. Reported besides
their lateness: how long after the launch /readyz said ready.

    .venv/bin/python bench/lateness.py
    .venv/bin/python bench/lateness.py --rates 1000 --env CRONHOOK_POLL_INTERVAL_S=0.02
With --membership, it measures a hand-over: under the last of --rates (1,000/s) for --seconds,
a `cronhook scheduler` replica joins the cluster --join-at-s (10) seconds after the first due
time and leaves (SIGTERM, a clean stop) --leave-at-s (20) seconds after it. Reported besides the
whole run's lateness: the lateness of the jobs due in the --window-s (5) seconds after the
join and after the leave, when partitions change hands, and the joiner's share of deliveries.

    .venv/bin/python bench/lateness.py
    .venv/bin/python bench/lateness.py --rates 1000 --env CRONHOOK_POLL_INTERVAL_S=0.02
    .venv/bin/python bench/lateness.py --from-start
    .venv/bin/python bench/lateness.py --membership
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness import (
    BenchDatabase,
    Service,
    add_database_url_arg,
    add_service_args,
    add_yardstick_args,
    counts_by,
    jobs_insert_series,
    load_peer,
    migrated_engine,
    parse_args,
    parse_env,
    positive_int,
    print_result,
    run_bench,
    target_for,
    target_in_store,
    wait_partitions_owned,
)
from profiles import brief, print_profile, profiled
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.engine import create_engine


def _late_figures(fig: dict[str, Any], n: int) -> dict[str, Any]:
    distinct = fig.get("distinct") or 0
    return {
        "jobs": n,
        "delivered": fig["delivered"],
        "duplicates": fig.get("duplicates"),
        "lost": n - distinct,
        "late_ms_p50": fig.get("late_ms_p50"),
        "late_ms_p99": fig.get("late_ms_p99"),
        "late_ms_max": fig.get("late_ms_max"),
        "late_basis": fig.get("late_basis"),
    }


async def phase(
    args: argparse.Namespace, rate: int, service: Service, engine: AsyncEngine, workdir: Path
) -> dict[str, Any]:
    n = rate * args.seconds
    side_by_side = load_peer("side_by_side", args.peers_dir)
    rx = side_by_side.Receiver(load_peer("env").ensure_peers_venv(), workdir, f"rate{rate}")
    try:
        target_id = await target_for(engine, service, rx.url + "/hook")
        first_due = time.time() + args.lead_s + n / 50_000
        async with engine.begin() as conn:
            await jobs_insert_series(conn, target_id, n, first_due, 1.0 / rate)
            await conn.execute(text("ANALYZE jobs"))
        await asyncio.sleep(max(0.0, first_due - time.time()))
        cpu0 = service.cpu_s()
        with profiled(args.profile, f"lateness-{rate}", service.pid) as profile:
            deadline = first_due + args.seconds + args.grace
            while time.time() < deadline:
                service.check_alive()
                if (rx.count() or 0) >= n:
                    break
                await asyncio.sleep(0.25)
            cpu_s = service.cpu_s() - cpu0
        rx.settle(n, quiet_s=args.quiet_s, timeout=5.0)
    finally:
        rx.stop()
    fig = side_by_side.figures(rx.records(), first_due, n)
    out = {
        "rate_per_s": rate,
        **_late_figures(fig, n),
        "cpu_ms_per_delivery": round(cpu_s * 1000 / max(fig["delivered"], 1), 3),
    }
    if profile:
        print_profile(f"cronhook at {rate}/s", profile)
        out["profile"] = brief(profile)
    return out


def _ready_after_s(service: Service, launched: float, timeout_s: float) -> float | None:
    """Seconds from the launch until /readyz answered 200 (None: not within timeout_s)."""
    while time.time() < launched + timeout_s:
        try:
            with urllib.request.urlopen(service.probe_base + "/readyz", timeout=1) as answer:
                if answer.status == 200:
                    return round(time.time() - launched, 3)
        except OSError:
            pass
        time.sleep(0.02)
    return None


async def from_start(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Jobs due in the first seconds after the command is launched (module docstring)."""
    n = args.start_jobs
    side_by_side = load_peer("side_by_side", args.peers_dir)
    async with BenchDatabase(args.database_url) as url:
        engine = await migrated_engine(url)
        rx = side_by_side.Receiver(load_peer("env").ensure_peers_venv(), workdir, "from-start")
        service = Service(args.cronhook_cmd, url, workdir / "cronhook.log", parse_env(args.env))
        try:
            target_id = await target_in_store(engine, rx.url + "/hook")
            launched = time.time()
            await asyncio.to_thread(service.start, False)
            ready_after_s = await asyncio.to_thread(_ready_after_s, service, launched, 60.0)
            # Due from --lead-s after /readyz said ready: what a user scheduling then expects.
            first_due = time.time() + args.lead_s
            async with engine.begin() as conn:
                await jobs_insert_series(conn, target_id, n, first_due, args.start_window_s / n)
            deadline = first_due + args.start_window_s + args.grace
            while time.time() < deadline and (rx.count() or 0) < n:
                service.check_alive()
                await asyncio.sleep(0.25)
            rx.settle(n, quiet_s=args.quiet_s, timeout=5.0)
        finally:
            rx.stop()
            await asyncio.to_thread(service.stop)
            await engine.dispose()
    fig = _late_figures(side_by_side.figures(rx.records(), first_due, n), n)
    fig |= {"first_due_after_ready_s": args.lead_s, "window_s": args.start_window_s, "ready_after_s": ready_after_s}
    print(
        f"from start: ready {ready_after_s} s after launch; jobs due {args.lead_s:g}-"
        f"{args.lead_s + args.start_window_s:g} s after ready: lateness p50 {fig['late_ms_p50']} ms, p99 "
        f"{fig['late_ms_p99']} ms, max {fig['late_ms_max']} ms; lost {fig['lost']}, duplicates {fig['duplicates']}"
    )
    return {"bench": "lateness", "mode": "from_start", "cmd": args.cronhook_cmd, "env": args.env, "phases": [fig]}


def _scheduled_s(record: dict[str, Any]) -> float:
    """A delivery's due time (its `cronhook-scheduled-for` header, ISO 8601) in epoch seconds."""
    return dt.datetime.fromisoformat(record["cronhook-scheduled-for"].replace("Z", "+00:00")).timestamp()


async def membership(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """A replica joins and leaves under a steady load (module docstring)."""
    rate = args.rates[-1]
    n = rate * args.seconds
    side_by_side = load_peer("side_by_side", args.peers_dir)
    async with BenchDatabase(args.database_url) as url:
        engine = create_engine(url, pool_size=2)
        env = parse_env(args.env)
        service = Service(args.cronhook_cmd, url, workdir / "cronhook.log", env)
        joiner = Service(args.joiner_cmd, url, workdir / "joiner.log", env, "joiner", service.api_key)
        rx = side_by_side.Receiver(load_peer("env").ensure_peers_venv(), workdir, "membership")
        try:
            await asyncio.to_thread(service.start)
            await wait_partitions_owned(engine, service.check_alive, args.settle_s)
            target_id = await target_for(engine, service, rx.url + "/hook")
            first_due = time.time() + args.lead_s + n / 50_000
            async with engine.begin() as conn:
                await jobs_insert_series(conn, target_id, n, first_due, 1.0 / rate)
                await conn.execute(text("ANALYZE jobs"))
            await asyncio.sleep(max(0.0, first_due + args.join_at_s - time.time()))
            joined = time.time()
            await asyncio.to_thread(joiner.start)
            await asyncio.sleep(max(0.0, first_due + args.leave_at_s - time.time()))
            left = time.time()
            left_took_s = await asyncio.to_thread(joiner.stop)
            deadline = first_due + args.seconds + args.grace
            while time.time() < deadline and (rx.count() or 0) < n:
                service.check_alive()
                await asyncio.sleep(0.25)
            rx.settle(n, quiet_s=args.quiet_s, timeout=5.0)
            by_replica = await counts_by(engine, "runs", "replica_id")
        finally:
            rx.stop()
            await asyncio.to_thread(joiner.stop)
            await asyncio.to_thread(service.stop)
            await engine.dispose()
    records = rx.records()
    out: dict[str, Any] = {"rate_per_s": rate, **_late_figures(side_by_side.figures(records, first_due, n), n)}
    for name, at in (("join", joined), ("leave", left)):
        window = [r for r in records if at <= _scheduled_s(r) < at + args.window_s]
        expected = sum(1 for i in range(n) if at <= first_due + i / rate < at + args.window_s)
        fig = _late_figures(side_by_side.figures(window, at, expected), expected)
        out[name] = {k: fig[k] for k in ("jobs", "delivered", "lost", "late_ms_p50", "late_ms_p99", "late_ms_max")}
    # `cronhook scheduler` runs one replica per CPU: joiner-1, joiner-2...
    by_joiner = sum(count for replica, count in by_replica.items() if replica.startswith("joiner"))
    out |= {"deliveries_by_replica": by_replica, "joiner_stop_s": round(left_took_s, 3)}
    print(
        f"{rate}/s with a replica joining at +{args.join_at_s:g} s and leaving at +{args.leave_at_s:g} s: "
        f"lateness p99 {out['late_ms_p99']} ms (max {out['late_ms_max']}); {args.window_s:g} s after the join "
        f"p99 {out['join']['late_ms_p99']} ms (max {out['join']['late_ms_max']}), after the leave p99 "
        f"{out['leave']['late_ms_p99']} ms (max {out['leave']['late_ms_max']}); joiner delivered {by_joiner}; "
        f"lost {out['lost']}, duplicates {out['duplicates']}"
    )
    return {"bench": "lateness", "mode": "membership", "cmd": args.cronhook_cmd, "env": args.env, "phases": [out]}


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    if args.from_start:
        return await from_start(args, workdir)
    if args.membership:
        return await membership(args, workdir)
    result: dict[str, Any] = {"bench": "lateness", "cmd": args.cronhook_cmd, "env": args.env, "phases": []}
    async with BenchDatabase(args.database_url) as url:
        engine = create_engine(url, pool_size=2)
        service = Service(args.cronhook_cmd, url, workdir / "cronhook.log", parse_env(args.env))
        try:
            await asyncio.to_thread(service.start)
            await wait_partitions_owned(engine, service.check_alive, args.settle_s)
            for rate in args.rates:
                fig = await phase(args, rate, service, engine, workdir)
                print(
                    f"{rate}/s: lateness p50 {fig['late_ms_p50']} ms, p99 {fig['late_ms_p99']} ms, max "
                    f"{fig['late_ms_max']} ms; {fig['delivered']} delivered, duplicates {fig['duplicates']}, "
                    f"lost {fig['lost']}; {fig['cpu_ms_per_delivery']} ms CPU per delivery"
                )
                result["phases"].append(fig)
        finally:
            await asyncio.to_thread(service.stop)
            await engine.dispose()
    return result


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", type=positive_int, nargs="+", default=[100, 1000], help="jobs due per second")
    parser.add_argument("--seconds", type=positive_int, default=30, help="how long each rate lasts (30)")
    parser.add_argument("--grace", type=float, default=30.0, help="seconds after the last due time to give up")
    parser.add_argument("--lead-s", type=float, default=2.0, help="seconds from the insert to the first due time")
    parser.add_argument("--quiet-s", type=float, default=1.0, help="receiver quiet this long before its log is read")
    parser.add_argument("--from-start", action="store_true", help="jobs due in the first seconds after launch")
    parser.add_argument("--start-jobs", type=positive_int, default=10_000, help="with --from-start: how many (10,000)")
    parser.add_argument("--start-window-s", type=float, default=10.0, help="with --from-start: due over (10 s)")
    parser.add_argument("--membership", action="store_true", help="a replica joins and leaves under load")
    parser.add_argument("--join-at-s", type=float, default=10.0, help="with --membership: join after (10 s)")
    parser.add_argument("--leave-at-s", type=float, default=20.0, help="with --membership: leave after (20 s)")
    parser.add_argument(
        "--joiner-cmd", default="cronhook scheduler --processes 1", help="with --membership: the replica that joins"
    )
    parser.add_argument("--window-s", type=float, default=5.0, help="with --membership: figures for (5 s)")
    add_database_url_arg(parser)
    add_service_args(parser, "cronhook up")
    add_yardstick_args(parser)
    smoke = {"rates": [50], "seconds": 1, "grace": 10.0, "lead_s": 0.5, "quiet_s": 0.2, "settle_s": 0.2}
    return parse_args(parser, argv, smoke | {"cronhook_cmd": "cronhook up --processes 1"})


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    result = run_bench("cronhook-lateness-", lambda workdir: asyncio.run(run(args, workdir)))
    print_result(result)
    return 0 if all(p["lost"] == 0 and not p["duplicates"] for p in result["phases"]) else 1


if __name__ == "__main__":
    sys.exit(main())
