"""Chains at scale: `--parents` one-off jobs (default 1,000), each with `--children` chained
jobs (default 10) that run after its success, all due at once; `--cronhook-cmd` (default
`cronhook scheduler`, one process) delivers the parents, settles them and fires, then delivers,
their children, to the peers' fast receiver (../shared/peers/receiver.py).

The parents and the chained jobs are written in set-based INSERTs before the parents fall due
(seeding is not measured). Figures: how long from the parents' due time until every parent
and every child was delivered, children fired and delivered per second, and, from the
database and the receiver's log, children lost (a chained job without exactly one occurrence)
and doubled (a webhook-id delivered twice, or a chained job given two occurrences). JSON on
the last line.

    .venv/bin/python bench/chains.py
    .venv/bin/python bench/chains.py --parents 100 --children 100
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
    Service,
    add_database_url_arg,
    add_service_args,
    add_yardstick_args,
    jobs_insert_series,
    load_peer,
    parse_args,
    parse_env,
    positive_int,
    print_result,
    run_bench,
    target_for,
    wait_partitions_owned,
)
from sqlalchemy import text

from app.db.engine import create_engine

# `children` chained jobs after each unfinished one-off of the target's tenant, and the mark
# that makes the parents' settling look for them (what POST /v1/jobs with `after` writes).
_CHILDREN = text(
    """
    INSERT INTO jobs (id, tenant_id, target_id, partition, schedule_kind, schedule_anchor_at,
                      scheduled_for, occurrence_id, payload, state, attempt, max_attempts,
                      backoff_base_s, backoff_max_s, after_job_id, after_on)
    SELECT gen_random_uuid(), p.tenant_id, CAST(:target AS uuid), (abs(hashtext(p.id::text || g)) % 256),
           'after', now(), now(), gen_random_uuid(), jsonb_build_object('child', g), 'scheduled', 0, 5, 0.1, 1,
           p.id, 'success'
    FROM jobs p, generate_series(1, :children) AS g
    WHERE p.schedule_kind = 'once' AND p.state = 'scheduled'
    """
)
_MARK = text("UPDATE jobs SET fires_children = true WHERE schedule_kind = 'once' AND state = 'scheduled'")
# Per chained job, how many occurrences it was given (exactly one each is the promise).
_OCCURRENCES = text(
    """
    SELECT count(*) FILTER (WHERE n = 0) AS lost, count(*) FILTER (WHERE n > 1) AS doubled,
           coalesce(sum(n), 0) AS fired
    FROM (SELECT c.id, count(o.id) AS n FROM jobs c LEFT JOIN jobs o ON o.parent_job_id = c.id
          WHERE c.schedule_kind = 'after' GROUP BY c.id) per_child
    """
)


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    parents, children = args.parents, args.parents * args.children
    total = parents + children
    async with BenchDatabase(args.database_url) as url:
        engine = create_engine(url, pool_size=2)
        service = Service(args.cronhook_cmd, url, workdir / "cronhook.log", parse_env(args.env))
        side_by_side = load_peer("side_by_side", args.peers_dir)
        rx = side_by_side.Receiver(load_peer("env").ensure_peers_venv(), workdir, "chains")
        try:
            await asyncio.to_thread(service.start)
            await wait_partitions_owned(engine, service.check_alive, args.settle_s)
            parent_target = await target_for(engine, service, rx.url + "/parent")
            child_target = await target_for(engine, service, rx.url + "/child")
            due = time.time() + args.lead_s
            seeding = time.monotonic()
            async with engine.begin() as conn:
                await jobs_insert_series(conn, parent_target, parents, due, 0.0)
                await conn.execute(_CHILDREN, {"target": child_target, "children": args.children})
                await conn.execute(_MARK)
                await conn.execute(text("ANALYZE jobs"))
            seed_s = time.monotonic() - seeding
            if time.time() > due:
                raise SystemExit(f"seeding took {seed_s:.1f} s, past the parents' due time: raise --lead-s")
            await asyncio.sleep(max(0.0, due - time.time()))
            cpu0 = service.cpu_s()
            deadline = time.time() + args.timeout_s
            while time.time() < deadline and (rx.count() or 0) < total:
                service.check_alive()
                await asyncio.sleep(0.1)
            elapsed = time.time() - due
            cpu_s = service.cpu_s() - cpu0
            rx.settle(total, quiet_s=args.quiet_s, timeout=10.0)
            async with engine.connect() as conn:
                occurrences = (await conn.execute(_OCCURRENCES)).mappings().one()
        finally:
            rx.stop()
            await asyncio.to_thread(service.stop)
            await engine.dispose()
    records = rx.records()
    fig = side_by_side.figures(records, due, total)
    delivered_children = sum(1 for r in records if r.get("path", "").endswith("/child"))
    return {
        "bench": "chains",
        "cmd": args.cronhook_cmd,
        "parents": parents,
        "children_per_parent": args.children,
        "children": children,
        "seed_s": round(seed_s, 2),
        "all_delivered_s": round(elapsed, 3),
        "deliveries_per_s": round(total / elapsed, 1) if elapsed > 0 else None,
        "delivered": fig["delivered"],
        "delivered_children": delivered_children or None,
        "children_fired": int(occurrences["fired"]),
        "children_lost": int(occurrences["lost"]),
        "children_doubled": int(occurrences["doubled"]),
        "duplicate_deliveries": fig.get("duplicates"),
        "lost_deliveries": total - (fig.get("distinct") or 0),
        "cpu_ms_per_delivery": round(cpu_s * 1000 / max(fig["delivered"], 1), 3),
    }


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parents", type=positive_int, default=1000, help="parent jobs (1,000)")
    parser.add_argument("--children", type=positive_int, default=10, help="chained jobs per parent (10)")
    parser.add_argument("--lead-s", type=float, default=5.0, help="seconds from seeding to the parents' due time")
    parser.add_argument("--timeout-s", type=float, default=120.0, help="give up this long after the due time")
    parser.add_argument("--quiet-s", type=float, default=1.0, help="receiver quiet this long before its log is read")
    add_database_url_arg(parser)
    add_service_args(parser, "cronhook scheduler")
    add_yardstick_args(parser)
    smoke = {"parents": 20, "children": 3, "lead_s": 2.0, "timeout_s": 30.0, "quiet_s": 0.2, "settle_s": 0.2}
    return parse_args(parser, argv, smoke)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    result = run_bench("cronhook-chains-", lambda workdir: asyncio.run(run(args, workdir)))
    print_result(result)
    clean = not (result["children_lost"] or result["children_doubled"] or result["duplicate_deliveries"])
    return 0 if clean and result["lost_deliveries"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
