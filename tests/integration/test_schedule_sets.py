"""Schedule sets (PUT /v1/schedule-sets/{set}, app/api/schedule_sets.py) on a real PostgreSQL:
applied whole, re-applied without a write, one edit changing one schedule, dry runs writing
nothing, prune, a key of another set, a key listed twice, a bad item refusing the whole set,
and the listed definitions putting back unchanged."""

from __future__ import annotations

from typing import Any

import httpx
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store.tables import jobs
from tests.conftest import make_target
from tests.problems import assert_problem
from tests.receiver import Receiver


async def live_jobs(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        count = await conn.scalar(select(func.count()).where(jobs.c.state.not_in(["cancelled", "succeeded", "dead"])))
    return int(count or 0)


def schedules(target_id: str) -> list[dict[str, Any]]:
    return [
        {"key": "nightly-report", "target_id": target_id, "cron": "H 3 * * *", "payload": {"report": "daily"}},
        {"key": "hourly-sync", "target_id": target_id, "every_s": 3600, "misfire_policy": "skip"},
        {"key": "quarter-close", "target_id": target_id, "cron": "0 9 1 */3 *", "timezone": "Europe/Paris"},
    ]


async def put_set(
    client: httpx.AsyncClient, auth: dict[str, str], name: str, items: list[dict[str, Any]], **options: Any
) -> httpx.Response:
    params = {"dry_run": "true"} if options.pop("dry_run", False) else {}
    return await client.put(
        f"/v1/schedule-sets/{name}", headers=auth, params=params, json={"schedules": items, **options}
    )


async def by_key(client: httpx.AsyncClient, auth: dict[str, str]) -> dict[str, dict[str, Any]]:
    page = (await client.get("/v1/jobs", headers=auth, params={"limit": 200, "include": "payload"})).json()
    return {job["key"]: job for job in page["items"] if job["key"] and job["state"] != "cancelled"}


async def test_a_set_applies_whole_then_again_without_a_write_and_one_edit_changes_one(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, engine: AsyncEngine
) -> None:
    target = await make_target(client, auth, receiver.url())
    items = schedules(target["id"])
    first = await put_set(client, auth, "payments", items)
    assert first.status_code == 200, first.text
    assert sorted(first.json()["created"]) == ["hourly-sync", "nightly-report", "quarter-close"]
    before = await by_key(client, auth)
    assert {job["key"] for job in before.values()} == {"hourly-sync", "nightly-report", "quarter-close"}

    again = (await put_set(client, auth, "payments", items)).json()
    assert again["created"] == [] and again["changed"] == {} and len(again["unchanged"]) == 3
    assert await by_key(client, auth) == before

    items[0]["payload"] = {"report": "daily", "format": "pdf"}
    edited = (await put_set(client, auth, "payments", items)).json()
    assert edited["changed"] == {"nightly-report": ["payload"]}
    after = await by_key(client, auth)
    for key, job in after.items():
        assert job["next_run_at"] == before[key]["next_run_at"], key
        if key != "nightly-report":
            assert job["updated_at"] == before[key]["updated_at"], key
    assert after["nightly-report"]["payload"] == {"report": "daily", "format": "pdf"}


async def test_a_dry_run_answers_the_plan_and_writes_nothing(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, engine: AsyncEngine
) -> None:
    target = await make_target(client, auth, receiver.url())
    plan = await put_set(client, auth, "payments", schedules(target["id"]), dry_run=True)
    assert plan.status_code == 200, plan.text
    assert plan.json()["dry_run"] is True and len(plan.json()["created"]) == 3
    assert await live_jobs(engine) == 0
    await put_set(client, auth, "payments", schedules(target["id"]))
    pruning = (await put_set(client, auth, "payments", schedules(target["id"])[:1], prune=True, dry_run=True)).json()
    assert pruning["pruned"] == ["hourly-sync", "quarter-close"]
    assert await live_jobs(engine) == 3


async def test_prune_cancels_the_sets_unlisted_schedules_only(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, engine: AsyncEngine
) -> None:
    target = await make_target(client, auth, receiver.url())
    await put_set(client, auth, "payments", schedules(target["id"]))
    await put_set(client, auth, "billing", [{"key": "invoices", "target_id": target["id"], "every_s": 600}])
    kept = (await put_set(client, auth, "payments", schedules(target["id"])[:2])).json()
    assert kept["pruned"] == [] and await live_jobs(engine) == 4  # without prune, nothing goes
    pruned = (await put_set(client, auth, "payments", schedules(target["id"])[:2], prune=True)).json()
    assert pruned["pruned"] == ["quarter-close"]
    assert set(await by_key(client, auth)) == {"nightly-report", "hourly-sync", "invoices"}
    # The key is free again at once.
    back = (await put_set(client, auth, "payments", schedules(target["id"]))).json()
    assert back["created"] == ["quarter-close"]


async def test_refusals_name_the_item_and_nothing_is_half_applied(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, engine: AsyncEngine
) -> None:
    target = await make_target(client, auth, receiver.url())
    await put_set(client, auth, "billing", [{"key": "invoices", "target_id": target["id"], "every_s": 600}])
    items = schedules(target["id"])

    other_set = await put_set(
        client, auth, "payments", [*items, {"key": "invoices", "target_id": target["id"], "every_s": 60}]
    )
    assert_problem(other_set, 409, "schedules[3].key")
    twice = await put_set(client, auth, "payments", [*items, dict(items[1])])
    assert_problem(twice, 422, "schedules[1].key", "schedules[3].key")
    bad = [*items[:2], {**items[2], "cron": "61 * * * *"}]
    assert_problem(await put_set(client, auth, "payments", bad), 422, "schedules[2].cron")
    no_target = [*items[:2], {**items[2], "target_id": "00000000-0000-4000-8000-000000000000"}]
    assert_problem(await put_set(client, auth, "payments", no_target), 422, "schedules[2].target_id")
    bad_key = [*items[:2], {**items[2], "key": "Not A Key"}]
    assert_problem(await put_set(client, auth, "payments", bad_key), 422, "schedules[2].key")
    assert_problem(await put_set(client, auth, "Bad Set", items), 422, "set")
    assert await live_jobs(engine) == 1  # only the billing set's


async def test_the_listed_definitions_put_back_change_nothing(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver
) -> None:
    target = await make_target(client, auth, receiver.url())
    await put_set(client, auth, "payments", schedules(target["id"]))
    listed = (await client.get("/v1/schedules", headers=auth, params={"set": "payments"})).json()["items"]
    assert [item["key"] for item in listed] == ["hourly-sync", "nightly-report", "quarter-close"]
    assert all(item["set"] == "payments" for item in listed)
    assert listed[1]["cron"] == "H 3 * * *" and listed[0]["misfire_policy"] == "skip"
    items = [{k: v for k, v in item.items() if k != "set"} for item in listed]
    again = (await put_set(client, auth, "payments", items)).json()
    assert again["changed"] == {} and len(again["unchanged"]) == 3
