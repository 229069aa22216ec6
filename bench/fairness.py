"""Noisy neighbour: how late one tenant's jobs are while another tenant's receivers hang.

Per phase, on a fresh database with one `--cronhook-cmd` (default `cronhook scheduler`,
default settings): a noisy tenant's --noisy-jobs (250) one-off jobs, all due at once, go to
a receiver that holds every request --hang-s (30) seconds before answering (targets with
the largest timeout, 30 s), spread over `noisy_targets` targets; from one second later, a
quiet tenant's --quiet-jobs (200) jobs fall due --quiet-step-s (0.05) apart, to a receiver
that answers at once. Lateness per quiet request = arrival - its `cronhook-scheduled-for`
header; p50/p99/max in ms. Also: the most noisy requests held at once, and how many noisy
requests were answered before the last quiet one arrived (0: every quiet job went while the
noisy tenant's first deliveries still hung).

Phases: the noisy tenant's jobs on one target (the issue's scenario) and on five (no target
reaches the default per-target cap, the tenant share binds).

    .venv/bin/python bench/fairness.py --database-url postgresql://postgres@127.0.0.1:5432/postgres
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from aiohttp import web
from dispatch import BenchDatabase, add_database_url_arg, positive_int
from harness import Service, add_service_args, last_json_line, parse_env, run_bench, wait_partitions_owned

from app.db.engine import create_engine
from app.domain.job import NewJob
from app.domain.retry import RetryPolicy
from app.domain.schedule import OnceSchedule
from app.store.jobs import job_create_many
from app.store.targets import target_create
from app.store.tenants import tenant_ensure


class Receivers:
    """/noisy holds each request `hang_s`; /quiet answers at once and logs arrival times."""

    def __init__(self, hang_s: float) -> None:
        self.hang_s = hang_s
        self.quiet: list[tuple[float, str]] = []  # (arrival, cronhook-scheduled-for)
        self.noisy_in_flight = 0
        self.noisy_max_in_flight = 0
        self.noisy_answered = 0
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/noisy", self._noisy)
        app.router.add_post("/quiet", self._quiet)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, backlog=2048)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _noisy(self, request: web.Request) -> web.Response:
        await request.read()
        self.noisy_in_flight += 1
        self.noisy_max_in_flight = max(self.noisy_max_in_flight, self.noisy_in_flight)
        try:
            await asyncio.sleep(self.hang_s)
        finally:
            self.noisy_in_flight -= 1
        self.noisy_answered += 1
        return web.Response(text="ok")

    async def _quiet(self, request: web.Request) -> web.Response:
        arrival = time.time()
        await request.read()
        self.quiet.append((arrival, request.headers["cronhook-scheduled-for"]))
        return web.Response(text="ok")


async def add_jobs(
    engine: Any, tenant: str, url: str, targets: int, count: int, first_due: float, step_s: float
) -> None:
    policy = RetryPolicy(1, 1.0, 1.0)
    async with engine.begin() as conn:
        tenant_id = await tenant_ensure(conn, tenant)
        target_ids = []
        for n in range(targets):
            row, _ = await target_create(conn, tenant_id, f"{tenant}-{n}", url, {}, 30.0)
            target_ids.append(row["id"])
        news = []
        for i in range(count):
            due = dt.datetime.fromtimestamp(first_due + i * step_s, dt.UTC)
            news.append(NewJob(tenant_id, target_ids[i % targets], None, {"i": i}, 0, OnceSchedule(due), due, policy))
        await job_create_many(conn, news)


async def phase(args: argparse.Namespace, noisy_targets: int, workdir: Path) -> dict[str, Any]:
    database = BenchDatabase(args.database_url)
    receivers = Receivers(args.hang_s)
    service: Service | None = None
    engine = None
    try:
        url = await database.start()
        engine = create_engine(url, pool_size=2)
        service = Service(args.cronhook_cmd, url, workdir / f"cronhook-{noisy_targets}.log", parse_env(args.env))
        await receivers.start()
        await asyncio.to_thread(service.start)
        await wait_partitions_owned(engine, service)
        base = f"http://127.0.0.1:{receivers.port}"
        start = time.time()
        if noisy_targets > 0:
            await add_jobs(engine, "noisy", base + "/noisy", noisy_targets, args.noisy_jobs, start, 0.0)
        quiet_first = start + 1.0
        await add_jobs(engine, "quiet", base + "/quiet", 1, args.quiet_jobs, quiet_first, args.quiet_step_s)
        deadline = quiet_first + args.quiet_jobs * args.quiet_step_s + args.hang_s + 30
        while len(receivers.quiet) < args.quiet_jobs and time.time() < deadline:
            service.check_alive()
            await asyncio.sleep(0.1)
        answered_meanwhile = receivers.noisy_answered
    finally:
        if service is not None:
            await asyncio.to_thread(service.stop)
        await receivers.stop()
        if engine is not None:
            await engine.dispose()
        await database.stop()
    late_ms = sorted(
        (arrival - dt.datetime.fromisoformat(scheduled.replace("Z", "+00:00")).timestamp()) * 1000
        for arrival, scheduled in receivers.quiet
    )
    return {
        "noisy_targets": noisy_targets,
        "noisy_jobs": args.noisy_jobs if noisy_targets else 0,
        "hang_s": args.hang_s,
        "quiet_jobs": args.quiet_jobs,
        "quiet_delivered": len(late_ms),
        "late_ms_p50": round(statistics.median(late_ms), 1) if late_ms else None,
        "late_ms_p99": round(late_ms[min(len(late_ms) - 1, int(len(late_ms) * 0.99))], 1) if late_ms else None,
        "late_ms_max": round(late_ms[-1], 1) if late_ms else None,
        "noisy_max_in_flight": receivers.noisy_max_in_flight,
        "noisy_answered_before_quiet_done": answered_meanwhile,
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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
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
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run_bench("cronhook-fairness-", lambda workdir: asyncio.run(run(args, workdir)))
    last_json_line(result)
    return 0 if all(p["quiet_delivered"] == p["quiet_jobs"] for p in result["phases"]) else 1


if __name__ == "__main__":
    sys.exit(main())
