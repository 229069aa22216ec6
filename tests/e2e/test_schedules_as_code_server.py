"""Schedules as code against a real `cronhook up` (its own processes, a real PostgreSQL):
twenty concurrent PUTs of one key from separate connections leave one job, a set's dry run
writes nothing and its prune frees keys at once, and labels find jobs, targets and schedules."""

from __future__ import annotations

import asyncio

import httpx

from tests.e2e.live_server import live_server
from tests.e2e.test_processes import Processes
from tests.receiver import Receiver


async def test_named_schedules_sets_and_labels_on_a_live_server(
    receiver: Receiver, db_url: str, procs: Processes
) -> None:
    async with live_server(procs, db_url) as server:
        async with httpx.AsyncClient(base_url=server.url, headers=server.auth, timeout=30) as http:
            target = await http.put(
                "/v1/targets/by-name/billing", json={"url": receiver.url(), "labels": {"team": "payments"}}
            )
            assert target.status_code == 201 and target.json()["secret"], target.text
            body = {"target_id": target.json()["id"], "cron": "H 4 * * *", "labels": {"team": "payments"}}

            async def put() -> httpx.Response:
                # A connection of its own each: the server sees twenty clients at once.
                async with httpx.AsyncClient(base_url=server.url, headers=server.auth, timeout=30) as one:
                    return await one.put("/v1/schedules/nightly", json=body)

            answers = await asyncio.gather(*(put() for _ in range(20)))
            assert sorted(a.status_code for a in answers) == [200] * 19 + [201], [a.text for a in answers]
            assert len({a.json()["id"] for a in answers}) == 1

            items = [{"key": f"sync-{i}", "target_id": target.json()["id"], "every_s": 600 + i} for i in range(3)]
            plan = await http.put("/v1/schedule-sets/ops", params={"dry_run": "true"}, json={"schedules": items})
            assert plan.status_code == 200 and plan.json()["created"] == ["sync-0", "sync-1", "sync-2"], plan.text
            assert (await http.get("/v1/schedules", params={"set": "ops"})).json()["items"] == []
            applied = await http.put("/v1/schedule-sets/ops", json={"schedules": items})
            assert applied.json()["created"] == ["sync-0", "sync-1", "sync-2"]
            pruned = await http.put("/v1/schedule-sets/ops", json={"schedules": items[:1], "prune": True})
            assert pruned.json()["pruned"] == ["sync-1", "sync-2"]
            again = await http.put("/v1/schedules/sync-2", json={k: v for k, v in items[2].items() if k != "key"})
            assert again.status_code == 201  # the pruned key was free at once

            jobs = (await http.get("/v1/jobs", params={"label": "team=payments"})).json()["items"]
            assert [job["key"] for job in jobs] == ["nightly"]
            targets = (await http.get("/v1/targets", params={"label": "team=payments"})).json()["items"]
            assert [t["name"] for t in targets] == ["billing"]
            named = (await http.get("/v1/schedules", params={"label": "team=payments"})).json()["items"]
            assert [s["key"] for s in named] == ["nightly"]
