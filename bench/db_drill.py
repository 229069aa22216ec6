"""Database fault drills under load: a failover and a commit stall while ~1,000 jobs fall due
each second, on real PostgreSQL 15 servers (tests/pg_cluster.py: a primary and a synchronous
standby on free 127.0.0.1 ports, scram-sha-256 logins).

Each drill gets a fresh cluster, migrates it, starts `--cronhook-cmd` (default `cronhook
scheduler`) and `cronhook reaper` on a multi-host URL listing both servers (the password in
CRONHOOK_DATABASE_PASSWORD_FILE), waits until the partitions are owned, inserts rate x
--seconds one-off jobs due 1/rate apart (one set-based INSERT, before the first is due), and
strikes `--fault-at` seconds into the load:

- failover: the primary crashes (pg_ctl stop -m immediate); `--outage-s` later (the time a
  failover manager takes to decide) the standby is promoted;
- stall: the synchronous standby stops, so every commit on the primary waits; it starts again
  `--outage-s` later.

Per drill: lost (jobs never delivered), duplicates (requests beyond the first per webhook-id)
and how many of them were not in flight at the fault (jobs leased then: read on the standby
for a failover, on the primary during a stall; anything but 0 is a bug), time from the fault
to the first warning in the processes' logs (database_stalled, <service>_db_unavailable),
/readyz transitions of both processes (seconds from the fault, status; 0 = no answer), and
recovery: from the fault's end (the fix begins: promote, or start the standby; `fix_s` is
how long that took) to the first delivery, to readiness 200 again, and to deliveries on time
again (lateness under 1 s); stragglers are jobs due before the fix delivered more than 15 s
after it (a claim committed but never answered stays leased until its lease runs out).
Lateness = receive time - the request's cronhook-scheduled-for header.

The receiver is bench/dispatch.py's (a child process answering 200 at once). A few
human-readable lines, then one JSON object as the last line; exit 1 when a job was lost or
delivered twice outside the in-flight bound.

    .venv/bin/python bench/db_drill.py
    .venv/bin/python bench/db_drill.py --drills stall --rate 500 --seconds 20 --outage-s 8
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import itertools
import json
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# bench/ is on sys.path when this runs as a script; the repository root holds tests/pg_cluster.py.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx
from dispatch import Receiver, percentile, positive_int
from harness import (
    Service,
    free_port,
    jobs_insert_series,
    last_json_line,
    parse_env,
    run_bench,
    target_for,
    wait_partitions_owned,
)
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from app.db.engine import create_engine, normalize_url
from app.db.migrate import migrate_to_head
from app.store.tables import jobs
from tests.pg_cluster import PG_BIN, PgCluster, available

DATABASE = "cronhook"
ROLE = "cronhook"
ROLE_PASSWORD = "drill:p@ss/w#rd?"
DRILLS = ("failover", "stall")
READY_POLL_S = 0.1
# Events that tell an operator the database is in trouble.
WARNING_EVENTS = ("database_stalled", "_db_unavailable", "database_wait")
ON_TIME_S = 1.0
STRAGGLER_S = 15.0


@dataclass
class ReadinessLog:
    """/readyz of one process, polled; a row per change: (time.time(), status, 0 = no answer)."""

    url: str
    changes: list[tuple[float, int]] = field(default_factory=list)
    # Set while the last answer was 200.
    ready: asyncio.Event = field(default_factory=asyncio.Event)

    async def follow(self, stop: asyncio.Event) -> None:
        async with httpx.AsyncClient(timeout=2) as http:
            while not stop.is_set():
                try:
                    status = (await http.get(self.url)).status_code
                except httpx.HTTPError:
                    status = 0
                if not self.changes or self.changes[-1][1] != status:
                    self.changes.append((time.time(), status))
                    if status == 200:
                        self.ready.set()
                    else:
                        self.ready.clear()
                try:
                    await asyncio.wait_for(stop.wait(), READY_POLL_S)
                except TimeoutError:
                    pass

    def relative(self, origin: float) -> list[tuple[float, int]]:
        return [(round(at - origin, 2), status) for at, status in self.changes]

    def ready_again(self, after: float) -> float | None:
        """When /readyz answered 200 again at or after `after` (having failed since the fault)."""
        for at, status in self.changes:
            if at >= after and status == 200:
                return at
        return None


def log_events(path: Path) -> list[dict[str, Any]]:
    found = []
    for line in path.read_text(errors="replace").splitlines():
        if not line.startswith("{"):
            continue
        try:
            found.append(json.loads(line))
        except ValueError:
            continue
    return found


def event_time(event: dict[str, Any]) -> float:
    return dt.datetime.fromisoformat(event["ts"]).timestamp()


def first_warning(logs: list[Path], since: float) -> tuple[float, str] | None:
    """(time, event) of the first warning about the database logged at or after `since`."""
    warnings = [
        (event_time(e), str(e["event"]))
        for path in logs
        for e in log_events(path)
        if e.get("level") == "warning" and str(e.get("event", "")).endswith(WARNING_EVENTS)
    ]
    later = sorted(w for w in warnings if w[0] >= since)
    return later[0] if later else None


async def leased_webhook_ids(url: str) -> set[str]:
    """The deliveries in flight: webhook ids (msg_<occurrence id>) of the jobs leased now."""
    engine = create_async_engine(normalize_url(url), poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(select(jobs.c.occurrence_id).where(jobs.c.state == "running"))
            return {f"msg_{occurrence.hex}" for occurrence in rows.scalars()}
    finally:
        await engine.dispose()


async def unfinished(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int(await conn.scalar(select(func.count()).where(jobs.c.state != "succeeded")) or 0)


def seconds_after(origin: float, at: float | None) -> float | None:
    return None if at is None else round(at - origin, 2)


async def drill(args: argparse.Namespace, kind: str, workdir: Path) -> dict[str, Any]:
    n = args.rate * args.seconds
    folder = workdir / kind
    folder.mkdir()
    password_file = folder / "db-password"
    password_file.write_text(ROLE_PASSWORD + "\n")
    cluster = PgCluster()
    receiver = Receiver()
    services: list[Service] = []
    engine: AsyncEngine | None = None
    stop = asyncio.Event()
    followers: list[asyncio.Task[None]] = []
    try:
        await receiver.start()
        primary = await asyncio.to_thread(cluster.primary)
        standby = await asyncio.to_thread(cluster.add_standby, primary, "standby", True)
        await asyncio.to_thread(cluster.create_database, primary, DATABASE, ROLE, ROLE_PASSWORD)
        nodes = [primary, standby]
        engine = create_engine(cluster.url(nodes, DATABASE, ROLE, ROLE_PASSWORD), pool_size=2, pre_ping=True)
        await migrate_to_head(engine)
        target_id = await target_for(engine, None, f"{receiver.base}/hook")

        readiness: dict[str, ReadinessLog] = {}
        for name, cmd in (("scheduler", args.cronhook_cmd), ("reaper", "cronhook reaper")):
            port = free_port()
            env = {
                "CRONHOOK_DATABASE_PASSWORD_FILE": str(password_file),
                "CRONHOOK_METRICS_PORT": str(port),
                "CRONHOOK_LOG_LEVEL": "INFO",
                "CRONHOOK_LOG_FORMAT": "json",
                "CRONHOOK_DB_STALL_WARN_S": str(args.warn_s),
                **parse_env(args.env),
            }
            service = Service(cmd, cluster.url(nodes, DATABASE, ROLE), folder / f"{name}.log", env)
            await asyncio.to_thread(service.start)
            services.append(service)
            readiness[name] = ReadinessLog(f"http://127.0.0.1:{port}/readyz")
        await wait_partitions_owned(engine, services[0])
        followers = [asyncio.create_task(r.follow(stop)) for r in readiness.values()]

        first_due = time.time() + 3.0 + n / 50_000
        async with engine.begin() as conn:
            await jobs_insert_series(conn, target_id, n, first_due, 1.0 / args.rate)
            await conn.execute(text("ANALYZE jobs"))
        lead_s = first_due - time.time()
        print(f"{kind}: {n} jobs due {args.rate}/s from +{lead_s:.1f} s; the fault {args.fault_at:g} s into them")

        await asyncio.sleep(max(0.0, first_due + args.fault_at - time.time()))
        fault_start = time.time()
        if kind == "failover":
            await asyncio.to_thread(cluster.crash, primary)
            # What the primary had committed is on the synchronous standby, readable before promotion.
            await asyncio.to_thread(cluster.wait_replayed, standby)
            in_flight = await leased_webhook_ids(cluster.superuser_url(standby, DATABASE))
            await asyncio.sleep(max(0.0, fault_start + args.outage_s - time.time()))
            fault_end = time.time()
            await asyncio.to_thread(cluster.promote, standby)
        else:
            await asyncio.to_thread(cluster.stop, standby)
            superuser = cluster.superuser_url(primary, DATABASE)
            # Reads go on during a stall. The deliveries in flight: the jobs leased during it, and
            # those whose claim was waiting for the standby (others see a commit once it returns).
            in_flight = await leased_webhook_ids(superuser)
            await asyncio.sleep(max(0.0, fault_start + args.outage_s - time.time()))
            fault_end = time.time()
            await asyncio.to_thread(cluster.start, standby)
            await asyncio.to_thread(cluster.wait_streaming, primary, standby, "sync")
            in_flight |= await leased_webhook_ids(superuser)
        fix_s = time.time() - fault_end
        span = f"+{fault_start - first_due:.1f} s to +{fault_end - first_due:.1f} s"
        print(f"{kind}: fault from {span} into the load, fixed in {fix_s:.1f} s")

        deadline = first_due + args.seconds + args.grace
        survived = True
        while time.time() < deadline:
            try:
                for service in services:
                    service.check_alive()
            except RuntimeError as exc:
                print(f"{kind}: {exc}")
                survived = False
                break
            if int((await receiver.stats())["distinct"]) >= n:
                break
            await asyncio.sleep(0.25)
        # Both processes should say 200 again; a bounded wait for it.
        try:
            await asyncio.wait_for(asyncio.gather(*(r.ready.wait() for r in readiness.values())), 30)
        except TimeoutError:
            print(f"{kind}: not ready 30 s after the last delivery: {[r.changes[-1:] for r in readiness.values()]}")
        left = await unfinished(engine)
        receipts = await receiver.receipts()
    finally:
        stop.set()
        await asyncio.gather(*followers, return_exceptions=True)
        for service in services:
            await asyncio.to_thread(service.stop)
        if engine is not None:
            await engine.dispose()
        await receiver.stop()
        await asyncio.to_thread(cluster.close)

    counts = Counter(msg_id for msg_id, _, _ in receipts)
    repeated = {msg_id: c - 1 for msg_id, c in counts.items() if c > 1}
    cache: dict[str, float] = {}
    late = sorted(at - _scheduled(header, cache) for _, header, at in receipts)
    after_fault = sorted(at for _, _, at in receipts if at >= fault_end)
    by_arrival = sorted(receipts, key=lambda receipt: receipt[2])
    on_time = next(
        (at for _, header, at in by_arrival if at >= fault_end and at - _scheduled(header, cache) < ON_TIME_S), None
    )
    gaps = [b[2] - a[2] for a, b in itertools.pairwise(by_arrival)]
    # Jobs due before the fix that came long after it: left leased (a claim whose answer was
    # lost) until their lease ran out and the reaper returned them.
    stragglers = [
        at for _, header, at in receipts if _scheduled(header, cache) < fault_end and at > fault_end + STRAGGLER_S
    ]
    warning = first_warning([s.log_path for s in services], fault_start)
    ready_again = [r.ready_again(fault_start) for r in readiness.values()]
    unready_seen = {name: any(s != 200 for at, s in r.changes if at >= fault_start) for name, r in readiness.items()}
    result = {
        "drill": kind,
        "rate_per_s": args.rate,
        "jobs": n,
        "delivered": len(counts),
        "lost": n - len(counts),
        "unfinished_in_db": left,
        "duplicates": sum(repeated.values()),
        "in_flight_at_fault": len(in_flight),
        "duplicates_outside_in_flight": sum(c for msg_id, c in repeated.items() if msg_id not in in_flight),
        "processes_survived": survived,
        "fault_started_s_into_load": round(fault_start - first_due, 2),
        "fault_s": round(fault_end - fault_start, 2),
        # How long the fix took (pg_ctl promote, or the standby's start); recovery counts from its start.
        "fix_s": round(fix_s, 2),
        "first_warning_s": seconds_after(fault_start, warning[0] if warning else None),
        "first_warning": warning[1] if warning else None,
        # Seconds from the fault's start, and the status from then on (0: no answer).
        "readiness": {name: r.relative(fault_start) for name, r in readiness.items()},
        "readiness_failed": unready_seen,
        "recovery_s": {
            "first_delivery": seconds_after(fault_end, after_fault[0] if after_fault else None),
            "ready": {
                name: seconds_after(fault_end, at)
                for name, at in zip(readiness, ready_again, strict=True)
                if unready_seen[name]
            },
            "on_time": seconds_after(fault_end, on_time),
        },
        "longest_delivery_gap_s": round(max(gaps), 2) if gaps else None,
        "stragglers": len(stragglers),
        "last_straggler_s": seconds_after(fault_end, max(stragglers) if stragglers else None),
        "lateness_ms": {
            "p50": round(percentile(late, 50) * 1000) if late else None,
            "p99": round(percentile(late, 99) * 1000) if late else None,
            "max": round(late[-1] * 1000) if late else None,
        },
    }
    print(
        f"{kind}: lost {result['lost']}, duplicates {result['duplicates']} "
        f"({result['duplicates_outside_in_flight']} outside the {len(in_flight)} in flight), first warning "
        f"{result['first_warning']} after {result['first_warning_s']} s, recovery {result['recovery_s']}, "
        f"readiness {result['readiness']}"
    )
    return result


def _scheduled(header: str, cache: dict[str, float]) -> float:
    value = cache.get(header)
    if value is None:
        value = dt.datetime.fromisoformat(header).timestamp()
        cache[header] = value
    return value


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    result: dict[str, Any] = {"bench": "db_drill", "cmd": args.cronhook_cmd, "env": args.env, "drills": []}
    for kind in args.drills:
        result["drills"].append(await drill(args, kind, workdir))
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drills", nargs="+", choices=DRILLS, default=list(DRILLS), help="which drills, in order")
    parser.add_argument("--rate", type=positive_int, default=1000, help="jobs due per second (1000)")
    parser.add_argument("--seconds", type=positive_int, default=15, help="how long the load lasts (15)")
    parser.add_argument("--fault-at", type=float, default=4.0, help="seconds into the load when the fault strikes (4)")
    parser.add_argument("--outage-s", type=float, default=5.0, help="how long the fault lasts (5)")
    parser.add_argument("--warn-s", type=float, default=1.0, help="CRONHOOK_DB_STALL_WARN_S (1)")
    parser.add_argument("--grace", type=float, default=60.0, help="seconds after the last due time to give up (60)")
    parser.add_argument(
        "--cronhook-cmd", default="cronhook scheduler", help='the scheduler command line (default "cronhook scheduler")'
    )
    parser.add_argument(
        "--env", action="append", default=[], metavar="NAME=VALUE", help="extra environment for both processes"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not available():
        raise SystemExit(f"PostgreSQL 15 server binaries not found in {PG_BIN} (set CRONHOOK_PG_BIN)")
    result = run_bench("cronhook-db-drill-", lambda workdir: asyncio.run(run(args, workdir)))
    last_json_line(result)
    failed = [d for d in result["drills"] if d["lost"] or d["duplicates_outside_in_flight"]]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
