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

The receiver is the harness's (a child process answering 200 at once). A few
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
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# bench/ is on sys.path when this runs as a script; tests/pg_cluster.py is found through the
# repository root (after the installed packages, so `app` stays the installed one).
sys.path.append(str(Path(__file__).resolve().parent.parent))

import httpx
from harness import (
    Receipt,
    Receiver,
    Services,
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
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from app.db.engine import normalize_url
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
            rows = await conn.execute(text("SELECT occurrence_id FROM jobs WHERE state = 'running'"))
            return {f"msg_{occurrence.hex}" for occurrence in rows.scalars()}
    finally:
        await engine.dispose()


async def unfinished(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int(await conn.scalar(text("SELECT count(*) FROM jobs WHERE state <> 'succeeded'")) or 0)


def seconds_after(origin: float, at: float | None) -> float | None:
    return None if at is None else round(at - origin, 2)


async def drill(args: argparse.Namespace, kind: str, workdir: Path) -> dict[str, Any]:
    n = args.rate * args.seconds
    folder = workdir / kind
    folder.mkdir()
    password_file = folder / "db-password"
    password_file.write_text(ROLE_PASSWORD + "\n")
    cluster = PgCluster()
    receiver = Receiver(folder)
    services: Services | None = None
    engine: AsyncEngine | None = None
    stop = asyncio.Event()
    followers: list[asyncio.Task[None]] = []
    try:
        await receiver.start()
        primary = await asyncio.to_thread(cluster.primary)
        standby = await asyncio.to_thread(cluster.add_standby, primary, "standby", True)
        await asyncio.to_thread(cluster.create_database, primary, DATABASE, ROLE, ROLE_PASSWORD)
        nodes = [primary, standby]
        url = cluster.url(nodes, DATABASE, ROLE, ROLE_PASSWORD)
        engine = await migrated_engine(url, pre_ping=True)
        target_id = await target_in_store(engine, f"{receiver.url}/hook")

        env = {
            "CRONHOOK_DATABASE_PASSWORD_FILE": str(password_file),
            "CRONHOOK_LOG_LEVEL": "INFO",
            "CRONHOOK_LOG_FORMAT": "json",
            "CRONHOOK_DB_STALL_WARN_S": str(args.warn_s),
            **parse_env(args.env),
        }
        services = Services(cluster.url(nodes, DATABASE, ROLE), folder, env)
        scheduler = services.start("scheduler", args.cronhook_cmd, wait=False)
        services.start("reaper", "cronhook reaper", wait=False)
        await asyncio.to_thread(services.wait_ready)
        readiness = {name: ReadinessLog(s.probe_base + "/readyz") for name, s in services.by_name.items()}
        await wait_partitions_owned(engine, scheduler.check_alive, args.settle_s)
        followers = [asyncio.create_task(r.follow(stop)) for r in readiness.values()]

        first_due = time.time() + args.lead_s + n / 50_000
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
                services.check_alive()
            except RuntimeError as exc:
                print(f"{kind}: {exc}")
                survived = False
                break
            if (await receiver.stats()).distinct >= n:
                break
            await asyncio.sleep(0.25)
        # Both processes should say 200 again; a bounded wait for it.
        try:
            await asyncio.wait_for(asyncio.gather(*(r.ready.wait() for r in readiness.values())), 30)
        except TimeoutError:
            print(f"{kind}: not ready 30 s after the last delivery: {[r.changes[-1:] for r in readiness.values()]}")
        left = await unfinished(engine)
        receipts = await receiver.receipts()
        logs = [s.log_path for s in services.by_name.values()]
    finally:
        stop.set()
        await asyncio.gather(*followers, return_exceptions=True)
        if services is not None:
            await asyncio.to_thread(services.stop_all)
        if engine is not None:
            await engine.dispose()
        await receiver.stop()
        await asyncio.to_thread(cluster.close)

    seen = Drilled(kind, n, first_due, fault_start, fault_end, fix_s, in_flight, receipts, left, survived, logs)
    return figures(args, seen, readiness)


@dataclass(frozen=True)
class Drilled:
    """What one drill did and saw: the fault's times, what was in flight then, what followed."""

    kind: str
    jobs: int
    first_due: float
    fault_start: float
    fault_end: float
    fix_s: float
    in_flight: set[str]
    receipts: list[Receipt]
    unfinished: int
    survived: bool
    logs: list[Path]


def figures(args: argparse.Namespace, seen: Drilled, readiness: dict[str, ReadinessLog]) -> dict[str, Any]:
    kind, n, receipts, fault_start, fault_end = seen.kind, seen.jobs, seen.receipts, seen.fault_start, seen.fault_end
    counts = Counter(receipt.webhook_id for receipt in receipts)
    repeated = {msg_id: c - 1 for msg_id, c in counts.items() if c > 1}
    by_arrival = sorted(receipts, key=lambda receipt: receipt.arrived)
    after_fault = [r.arrived for r in by_arrival if r.arrived >= fault_end]
    on_time = next(
        (r.arrived for r in by_arrival if r.arrived >= fault_end and r.arrived - (r.due or 0.0) < ON_TIME_S), None
    )
    gaps = [b.arrived - a.arrived for a, b in itertools.pairwise(by_arrival)]
    # Jobs due before the fix that came long after it: left leased (a claim whose answer was
    # lost) until their lease ran out and the reaper returned them.
    stragglers = [r.arrived for r in receipts if (r.due or 0.0) < fault_end and r.arrived > fault_end + STRAGGLER_S]
    warning = first_warning(seen.logs, fault_start)
    ready_again = [r.ready_again(fault_start) for r in readiness.values()]
    unready_seen = {name: any(s != 200 for at, s in r.changes if at >= fault_start) for name, r in readiness.items()}
    result = {
        "drill": kind,
        "rate_per_s": args.rate,
        "jobs": n,
        "delivered": len(counts),
        "lost": n - len(counts),
        "unfinished_in_db": seen.unfinished,
        "duplicates": sum(repeated.values()),
        "in_flight_at_fault": len(seen.in_flight),
        "duplicates_outside_in_flight": sum(c for msg_id, c in repeated.items() if msg_id not in seen.in_flight),
        "processes_survived": seen.survived,
        "fault_started_s_into_load": round(fault_start - seen.first_due, 2),
        "fault_s": round(fault_end - fault_start, 2),
        # How long the fix took (pg_ctl promote, or the standby's start); recovery counts from its start.
        "fix_s": round(seen.fix_s, 2),
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
        "lateness_ms": ms_summary(lateness_s(receipts)),
    }
    print(
        f"{kind}: lost {result['lost']}, duplicates {result['duplicates']} "
        f"({result['duplicates_outside_in_flight']} outside the {len(seen.in_flight)} in flight), first warning "
        f"{result['first_warning']} after {result['first_warning_s']} s, recovery {result['recovery_s']}, "
        f"readiness {result['readiness']}"
    )
    return result


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    result: dict[str, Any] = {"bench": "db_drill", "cmd": args.cronhook_cmd, "env": args.env, "drills": []}
    for kind in args.drills:
        result["drills"].append(await drill(args, kind, workdir))
    return result


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drills", nargs="+", choices=DRILLS, default=list(DRILLS), help="which drills, in order")
    parser.add_argument("--rate", type=positive_int, default=1000, help="jobs due per second (1000)")
    parser.add_argument("--seconds", type=positive_int, default=15, help="how long the load lasts (15)")
    parser.add_argument("--fault-at", type=float, default=4.0, help="seconds into the load when the fault strikes (4)")
    parser.add_argument("--outage-s", type=float, default=5.0, help="how long the fault lasts (5)")
    parser.add_argument("--warn-s", type=float, default=1.0, help="CRONHOOK_DB_STALL_WARN_S (1)")
    parser.add_argument("--grace", type=float, default=60.0, help="seconds after the last due time to give up (60)")
    parser.add_argument("--lead-s", type=float, default=3.0, help="seconds from the insert to the first due time (3)")
    add_service_args(parser, "cronhook scheduler")
    smoke = {"drills": ["stall"], "rate": 50, "seconds": 1, "fault_at": 0.3, "outage_s": 0.5, "grace": 20.0}
    return parse_args(
        parser, argv, smoke | {"lead_s": 0.5, "settle_s": 0.2, "cronhook_cmd": "cronhook scheduler --processes 1"}
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if not available():
        raise SystemExit(f"PostgreSQL 15 server binaries not found in {PG_BIN} (set CRONHOOK_PG_BIN)")
    result = run_bench("cronhook-db-drill-", lambda workdir: asyncio.run(run(args, workdir)))
    print_result(result)
    failed = [d for d in result["drills"] if d["lost"] or d["duplicates_outside_in_flight"]]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
