"""Schedule sets at scale: one `PUT /v1/schedule-sets/{set}` of `--schedules` named schedules
(default 5,000: cron, interval and one-off definitions, some with `H`), through a real
`cronhook api` process, timed end to end (request to answer): the first apply (every schedule
created), a dry run of the same file, the same set again (nothing written), one schedule's
payload edited, and a prune of a tenth of them. The issue's bar: a 5,000-schedule set applies
in under 5 s on this box. JSON on the last line.

    .venv/bin/python bench/schedule_sets.py
    .venv/bin/python bench/schedule_sets.py --schedules 10000
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
from harness import (
    BenchDatabase,
    Service,
    add_database_url_arg,
    add_service_args,
    parse_args,
    parse_env,
    positive_int,
    print_result,
    run_bench,
    target_for,
)

from app.db.engine import create_engine


def definitions(n: int, target_id: uuid.UUID) -> list[dict[str, Any]]:
    """n schedules of three kinds, as a deploy file would hold them."""
    items: list[dict[str, Any]] = []
    for i in range(n):
        item: dict[str, Any] = {"key": f"schedule-{i:06d}", "target_id": str(target_id), "payload": {"n": i}}
        if i % 3 == 0:
            item.update(cron="H H * * *", timezone="Europe/Berlin")
        elif i % 3 == 1:
            item.update(every_s=3600 + i, misfire_policy="skip")
        else:
            item.update(cron=f"{i % 60} {i % 24} * * 1-5")
        items.append(item)
    return items


async def timed_put(
    http: httpx.AsyncClient, name: str, items: list[dict[str, Any]], **params: Any
) -> tuple[float, dict[str, Any]]:
    body: dict[str, Any] = {"schedules": items}
    if params.pop("prune", False):
        body["prune"] = True
    started = time.perf_counter()
    answer = await http.put(f"/v1/schedule-sets/{name}", json=body, params=params)
    elapsed = time.perf_counter() - started
    if answer.status_code != 200:
        raise SystemExit(f"PUT {name}: {answer.status_code} {answer.text[:500]}")
    plan: dict[str, Any] = answer.json()
    return elapsed, plan


def counts(plan: dict[str, Any]) -> dict[str, int]:
    return {key: len(plan[key]) for key in ("created", "changed", "unchanged", "pruned")}


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    async with BenchDatabase(args.database_url) as url:
        engine = create_engine(url, pool_size=2)
        service = Service(args.cronhook_cmd, url, workdir / "cronhook.log", parse_env(args.env))
        try:
            await asyncio.to_thread(service.start)
            target_id = await target_for(engine, service, "https://example.com/hook")
            items = definitions(args.schedules, target_id)
            headers = {"Authorization": f"Bearer {service.api_key}"}
            async with httpx.AsyncClient(base_url=service.base_url, headers=headers, timeout=120) as http:
                dry_s, dry = await timed_put(http, "bench", items, dry_run="true")
                first_s, first = await timed_put(http, "bench", items)
                again_s, again = await timed_put(http, "bench", items)
                items[len(items) // 2]["payload"] = {"edited": True}
                edit_s, edit = await timed_put(http, "bench", items)
                kept = items[: len(items) - len(items) // 10]
                prune_s, prune = await timed_put(http, "bench", kept, prune=True)
        finally:
            await asyncio.to_thread(service.stop)
            await engine.dispose()
    return {
        "bench": "schedule_sets",
        "cmd": args.cronhook_cmd,
        "schedules": args.schedules,
        "dry_run_s": round(dry_s, 3),
        "first_apply_s": round(first_s, 3),
        "reapply_s": round(again_s, 3),
        "one_edit_s": round(edit_s, 3),
        "prune_tenth_s": round(prune_s, 3),
        "plans": {
            "dry_run": counts(dry),
            "first": counts(first),
            "again": counts(again),
            "edit": counts(edit),
            "prune": counts(prune),
        },
        "under_5_s": max(first_s, again_s, edit_s, prune_s, dry_s) < 5.0,
    }


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--schedules", type=positive_int, default=5000, help="schedules in the set (5,000)")
    add_database_url_arg(parser)
    add_service_args(parser, "cronhook api", partitions=False)
    return parse_args(parser, argv, {"schedules": 60})


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    result = run_bench("cronhook-schedule-sets-", lambda workdir: asyncio.run(run(args, workdir)))
    print_result(result)
    plans = result["plans"]
    n = args.schedules
    right = (
        plans["first"]["created"] == n
        and plans["again"]["unchanged"] == n
        and plans["edit"]["changed"] == 1
        and plans["prune"]["pruned"] == n // 10
    )
    return 0 if right else 1


if __name__ == "__main__":
    sys.exit(main())
