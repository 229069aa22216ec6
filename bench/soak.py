"""Soak: 3 `cronhook scheduler` processes and a `cronhook reaper` under steady load, with a
rolling restart, against a receiver that fails 10 % of requests and times out 1 %.

Load: `--recurring` jobs (default 1,000) firing every second (6-field cron `* * * * * *`) plus
`--one-offs-per-s` one-off jobs (default 50) created every second, for `--minutes` (default
10). During the soak each scheduler in turn gets SIGTERM (graceful stop) and is started
again under a new replica id (`--restarts`, default 3, spread over the run).

Checks and figures (JSON on the last line):
- lost occurrences: fire times of the recurring jobs inside the measured window (from 15 s
  after the start to 5 s before the end) with neither a run row (success, failure, missed,
  skipped) nor a request at the receiver; one-off jobs not delivered or dead-lettered;
- duplicates: webhook-ids answered 2xx more than once, and those of them not explained by a
  documented case (an attempt that timed out, or a lease rescued after its scheduler went
  away with the POST on the wire);
- after the load stops, the services run on until every one-off has finished and every
  recurring job is past the window (a backlog is late, not lost): `settle_after_load_s`;
- lateness (arrival at the receiver minus scheduled time, first attempts) p50/p99/max;
- RSS of every process at the start of the window and at the end;
- PostgreSQL connections to the database (pg_stat_activity), sampled every 2 s: max;
- retention: the reaper's delete rate is measured separately (bench/retention.py).

Default settings for the services (the promises are about them), except loopback egress.
Every process is stopped (SIGTERM, then SIGKILL) and the database dropped, even on failure.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import datetime as dt
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
from aiohttp import web
from bench_keys import BENCH_SECRET_KEYS
from dispatch import BenchDatabase, add_database_url_arg
from sqlalchemy import func, select, text

from app.db.engine import create_engine
from app.db.migrate import migrate_to_head
from app.domain.job import NewJob
from app.domain.occurrences import Recurrence
from app.domain.retry import RetryPolicy
from app.domain.schedule import CronSchedule, OnceSchedule
from app.store.jobs import db_now, job_create_many
from app.store.tables import jobs, runs
from app.store.targets import target_create
from app.store.tenants import tenant_ensure

CRONHOOK = str(Path(sys.executable).parent / "cronhook")
TARGET_TIMEOUT_S = 2.0
SLOW_REPLY_S = TARGET_TIMEOUT_S + 1.0
WARMUP_S = 15.0
TAIL_S = 5.0
SETTLE_S = 180.0
ENV = {
    "CRONHOOK_AUTO_MIGRATE": "false",
    "CRONHOOK_LOG_LEVEL": "WARNING",
    "CRONHOOK_EGRESS_ALLOW": "127.0.0.0/8",
}


class Receiver:
    """Answers 500 to 10 % of requests, answers 1 % after the target's timeout, 200 otherwise."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self.replies: dict[str, list[str]] = collections.defaultdict(list)
        # (job id, scheduled_for) of every request, and first-attempt lateness in seconds.
        self.seen: set[tuple[str, str]] = set()
        self.lateness: list[float] = []
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def _hook(self, request: web.Request) -> web.Response:
        arrived = time.time()
        await request.read()
        msg_id = request.headers.get("webhook-id", "")
        scheduled = request.headers.get("cronhook-scheduled-for", "")
        self.seen.add((request.headers.get("cronhook-job-id", ""), scheduled))
        if request.headers.get("cronhook-attempt") == "1" and scheduled:
            due = dt.datetime.fromisoformat(scheduled.replace("Z", "+00:00")).timestamp()
            self.lateness.append(arrived - due)
        draw = self._rng.random()
        if draw < 0.01:
            self.replies[msg_id].append("slow")
            await asyncio.sleep(SLOW_REPLY_S)
            return web.Response()
        if draw < 0.11:
            self.replies[msg_id].append("fail")
            return web.Response(status=500)
        self.replies[msg_id].append("ok")
        return web.Response()

    async def start(self) -> None:
        app = web.Application()
        app.add_routes([web.post("/hook", self._hook)])
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, backlog=4096)
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


class Processes:
    def __init__(self, db_url: str, log_dir: Path) -> None:
        self._env = {k: v for k, v in os.environ.items() if not k.startswith("CRONHOOK_")}
        # The key ring the bench sealed the target secret with (bench_keys.py).
        self._env.update(ENV, CRONHOOK_DATABASE_URL=db_url, CRONHOOK_SECRET_KEYS=BENCH_SECRET_KEYS)
        self._log_dir = log_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, role: str) -> None:
        env = {**self._env, "CRONHOOK_REPLICA_ID": name} if role == "scheduler" else self._env
        with (self._log_dir / f"{name}.log").open("wb") as log:
            self.procs[name] = subprocess.Popen([CRONHOOK, role], env=env, stdout=log, stderr=subprocess.STDOUT)

    async def stop(self, name: str, timeout_s: float = 60.0) -> float:
        proc = self.procs[name]
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(proc.wait, timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            await asyncio.to_thread(proc.wait, 5)
        return time.monotonic() - started

    def rss_mb(self) -> dict[str, float]:
        sizes = {}
        for name, proc in self.procs.items():
            if proc.poll() is None:
                try:
                    sizes[name] = round(psutil.Process(proc.pid).memory_info().rss / 2**20, 1)
                except psutil.NoSuchProcess:
                    pass
        return sizes

    async def stop_all(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is None:
                await self.stop(name, timeout_s=30)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


async def soak(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    receiver = Receiver(rng)
    await receiver.start()
    database = BenchDatabase(args.database_url)
    db_url = await database.start()
    engine = create_engine(db_url, pool_size=4)
    log_dir = Path(tempfile.mkdtemp(prefix="soak"))
    procs = Processes(db_url, log_dir)
    try:
        await migrate_to_head(engine)
        async with engine.begin() as conn:
            tenant = await tenant_ensure(conn, "soak")
            target, _ = await target_create(
                conn, tenant, name="t", url=f"http://127.0.0.1:{receiver.port}/hook", headers={}, timeout_s=2.0
            )
            now = await db_now(conn)
            every_second = CronSchedule("* * * * * *")
            first = now.replace(microsecond=0) + dt.timedelta(seconds=WARMUP_S / 2)
            recurring = [
                NewJob(
                    tenant_id=tenant,
                    target_id=target["id"],
                    name=f"r{i}",
                    payload={"r": i},
                    priority=0,
                    schedule=every_second,
                    first_fire_at=first,
                    policy=RetryPolicy(5, 1.0, 10.0),
                    recurrence=Recurrence(every_second, anchor=first),
                )
                for i in range(args.recurring)
            ]
            recurring_ids = []
            for start in range(0, len(recurring), 100):
                rows = await job_create_many(conn, recurring[start : start + 100])
                recurring_ids.extend(row["id"] for row in rows)
        names = ["s1", "s2", "s3"]
        for name in names:
            procs.start(name, "scheduler")
        procs.start("reaper", "reaper")

        one_off_ids: list[uuid.UUID] = []
        connections: list[int] = []
        restarts: list[dict[str, Any]] = []
        duration_s = args.minutes * 60
        started = time.monotonic()
        window_start = first + dt.timedelta(seconds=WARMUP_S)
        rss_start: dict[str, float] = {}
        restart_at = [duration_s * (i + 1) / (args.restarts + 1) for i in range(args.restarts)]
        generation = collections.Counter[str]()
        next_sample = 0.0
        while (elapsed := time.monotonic() - started) < duration_s:
            tick = time.monotonic()
            async with engine.begin() as conn:
                now = await db_now(conn)
                due_times = [now + dt.timedelta(seconds=rng.random()) for _ in range(args.one_offs_per_s)]
                batch = [
                    NewJob(
                        tenant_id=tenant,
                        target_id=target["id"],
                        name=None,
                        payload={"o": len(one_off_ids) + i},
                        priority=0,
                        schedule=OnceSchedule(due),
                        first_fire_at=due,
                        policy=RetryPolicy(5, 1.0, 10.0),
                    )
                    for i, due in enumerate(due_times)
                ]
                one_off_ids.extend(row["id"] for row in await job_create_many(conn, batch))
                if elapsed >= next_sample:
                    connections.append(
                        int(
                            await conn.scalar(
                                text("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
                            )
                            or 0
                        )
                    )
                    next_sample = elapsed + 2.0
            if not rss_start and elapsed >= WARMUP_S:
                rss_start = procs.rss_mb()
            if restart_at and elapsed >= restart_at[0]:
                restart_at.pop(0)
                victim = names[len(restarts) % len(names)]
                current = f"{victim}-{generation[victim]}" if generation[victim] else victim
                stop_s = await procs.stop(current)
                generation[victim] += 1
                procs.start(f"{victim}-{generation[victim]}", "scheduler")
                restarts.append({"stopped": current, "at_s": round(elapsed, 1), "stop_took_s": round(stop_s, 1)})
            for name, proc in procs.procs.items():
                if proc.poll() is not None and not any(r["stopped"] == name for r in restarts):
                    raise RuntimeError(f"{name} exited: {(log_dir / f'{name}.log').read_text()[-2000:]}")
            await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
        rss_end = procs.rss_mb()
        async with engine.connect() as conn:
            window_end = await db_now(conn) - dt.timedelta(seconds=TAIL_S)

        # Settle: every one-off finished (delivered or dead-lettered).
        deadline = time.monotonic() + SETTLE_S
        while time.monotonic() < deadline:
            async with engine.connect() as conn:
                open_one_offs = await conn.scalar(
                    select(func.count())
                    .select_from(jobs)
                    .where(jobs.c.id.in_(one_off_ids), jobs.c.state.not_in(["succeeded", "dead"]))
                )
            if not open_one_offs:
                break
            await asyncio.sleep(1.0)
        # ... and every recurring job past the window (a backlog drained: late, not lost).
        while time.monotonic() < deadline:
            async with engine.connect() as conn:
                behind = await conn.scalar(
                    select(func.count())
                    .select_from(jobs)
                    .where(jobs.c.id.in_(recurring_ids), jobs.c.scheduled_for <= window_end)
                )
            if not behind:
                break
            await asyncio.sleep(1.0)
        settle_s = round(time.monotonic() - (deadline - SETTLE_S), 1)

        lost_occurrences = await count_lost(engine, recurring_ids, window_start, window_end, receiver.seen)
        async with engine.connect() as conn:
            undelivered = await conn.scalar(
                select(func.count())
                .select_from(jobs)
                .where(jobs.c.id.in_(one_off_ids), jobs.c.state.not_in(["succeeded", "dead"]))
            )
            by_outcome = select(runs.c.outcome, func.count().label("n")).group_by(runs.c.outcome)
            outcomes = {row.outcome: row.n for row in await conn.execute(by_outcome)}
            # The documented causes of a repeat: the receiver's answer came too late (timeout),
            # or the POST was on the wire when its scheduler went away (lease_expired).
            documented = {
                f"msg_{occurrence.hex}"
                for occurrence in (
                    await conn.execute(
                        select(runs.c.occurrence_id).where(runs.c.outcome.in_(["timeout", "lease_expired"]))
                    )
                ).scalars()
            }
        twice = {msg_id for msg_id, replies in receiver.replies.items() if replies.count("ok") >= 2}
        dup_after_slow = sum(
            1
            for replies in receiver.replies.values()
            if replies.count("ok") + replies.count("slow") >= 2 and "slow" in replies
        )
        fire_times = args.recurring * max(0, int((window_end - window_start).total_seconds()))
        return {
            "bench": "soak",
            "minutes": args.minutes,
            "schedulers": 3,
            "recurring_jobs": args.recurring,
            "one_offs": len(one_off_ids),
            "requests": sum(len(r) for r in receiver.replies.values()),
            "fire_times_in_window": fire_times,
            "lost_occurrences": lost_occurrences,
            "one_offs_unfinished": int(undelivered or 0),
            "settle_after_load_s": settle_s,
            "duplicates_2xx_twice": len(twice),
            "duplicates_undocumented": len(twice - documented),
            # Sent again after the receiver answered too late (a timeout): documented, retried.
            "retried_after_receiver_timeout": dup_after_slow,
            "run_outcomes": outcomes,
            "lateness_s": {
                "p50": percentile(receiver.lateness, 0.5),
                "p99": percentile(receiver.lateness, 0.99),
                "max": round(max(receiver.lateness), 3) if receiver.lateness else None,
                "mean": round(statistics.fmean(receiver.lateness), 3) if receiver.lateness else None,
            },
            "rss_mb_start": rss_start,
            "rss_mb_end": rss_end,
            "pg_connections": {"max": max(connections, default=0), "last": connections[-1] if connections else 0},
            "rolling_restarts": restarts,
            "database": database.kind,
        }
    finally:
        await procs.stop_all()
        await engine.dispose()
        await database.stop()
        await receiver.stop()


async def count_lost(
    engine: Any, recurring_ids: list[uuid.UUID], start: dt.datetime, end: dt.datetime, seen: set[tuple[str, str]]
) -> int:
    """Fire times of the recurring jobs in [start, end] with neither a run row nor a request."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(runs.c.job_id, runs.c.scheduled_for).where(
                runs.c.job_id.in_(recurring_ids), runs.c.scheduled_for >= start, runs.c.scheduled_for <= end
            )
        )
        accounted = {(str(row.job_id), row.scheduled_for.timestamp()) for row in rows}
    for job_id, scheduled in seen:
        if scheduled:
            at = dt.datetime.fromisoformat(scheduled.replace("Z", "+00:00")).timestamp()
            accounted.add((job_id, at))
    first = int(start.timestamp()) + (0 if start.timestamp() == int(start.timestamp()) else 1)
    seconds = range(first, int(end.timestamp()) + 1)
    expected = ((job_id, float(second)) for job_id in map(str, recurring_ids) for second in seconds)
    return sum(1 for key in expected if key not in accounted)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="soak length (default 10)")
    parser.add_argument("--recurring", type=int, default=1000, help="recurring jobs firing every second")
    parser.add_argument("--one-offs-per-s", type=int, default=50, help="one-off jobs created per second")
    parser.add_argument("--restarts", type=int, default=3, help="rolling restarts (SIGTERM, start again)")
    parser.add_argument("--seed", type=int, default=1)
    add_database_url_arg(parser)
    args = parser.parse_args()
    result = asyncio.run(soak(args))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
