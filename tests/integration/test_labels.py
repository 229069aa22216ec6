"""Labels on jobs (and the named schedules' definitions): validated, shown, changed by PATCH
and PUT, and found with `?label=key=value` on the lists, on a real PostgreSQL."""

from __future__ import annotations

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from app.services.scheduler import Scheduler
from app.services.scheduler_config import SchedulerConfig
from app.settings import Settings
from tests.conftest import TEST_KEY_RING, make_job, make_target
from tests.problems import assert_problem
from tests.receiver import Receiver, wait_for


async def keys_of(client: httpx.AsyncClient, auth: dict[str, str], path: str, *selectors: str) -> set[str]:
    answer = await client.get(path, headers=auth, params=[("label", s) for s in selectors])
    assert answer.status_code == 200, answer.text
    return {item.get("name") or item.get("key") for item in answer.json()["items"]}


async def test_jobs_carry_labels_and_lists_find_them(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver
) -> None:
    target = await make_target(client, auth, receiver.url())
    pay = await make_job(client, auth, target["id"], every_s=60, name="pay", labels={"team": "payments", "tier": "1"})
    await make_job(client, auth, target["id"], every_s=60, name="ops", labels={"team": "ops"})
    await make_job(client, auth, target["id"], every_s=60, name="bare")
    assert pay["labels"] == {"team": "payments", "tier": "1"}
    assert await keys_of(client, auth, "/v1/jobs", "team=payments") == {"pay"}
    assert await keys_of(client, auth, "/v1/jobs", "team=payments", "tier=1") == {"pay"}
    assert await keys_of(client, auth, "/v1/jobs", "team=payments", "tier=2") == set()
    assert await keys_of(client, auth, "/v1/jobs") == {"pay", "ops", "bare"}

    changed = await client.patch(f"/v1/jobs/{pay['id']}", headers=auth, json={"labels": {"team": "ops"}})
    assert changed.status_code == 200 and changed.json()["labels"] == {"team": "ops"}
    assert await keys_of(client, auth, "/v1/jobs", "team=ops") == {"pay", "ops"}
    # A label change is not a schedule change: the fire time stands.
    assert changed.json()["next_run_at"] == pay["next_run_at"]


async def test_bad_labels_and_selectors_are_422_naming_the_field(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver
) -> None:
    target = await make_target(client, auth, receiver.url())
    for labels in ({"Team": "x"}, {"team": "has space"}, {"-team": "x"}, {f"k{i}": "v" for i in range(17)}, {"t": 5}):
        answer = await client.post(
            "/v1/jobs", headers=auth, json={"target_id": target["id"], "delay_s": 5, "labels": labels}
        )
        assert answer.status_code == 422, (labels, answer.text)
        assert {e["field"] for e in answer.json()["errors"]} <= {"labels"} | {f"labels.{k}" for k in labels}
    assert_problem(await client.get("/v1/jobs", headers=auth, params={"label": "team"}), 422, "label")
    assert_problem(await client.get("/v1/jobs", headers=auth, params={"label": "Bad=x"}), 422, "label")


async def test_a_schedules_labels_are_part_of_its_definition(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver
) -> None:
    target = await make_target(client, auth, receiver.url())
    body = {"target_id": target["id"], "every_s": 600, "labels": {"team": "payments"}}
    created = (await client.put("/v1/schedules/sync", headers=auth, json=body)).json()
    assert created["labels"] == {"team": "payments"}
    same = (await client.put("/v1/schedules/sync", headers=auth, json=body)).json()
    assert same["changed"] == []
    relabelled = (await client.put("/v1/schedules/sync", headers=auth, json={**body, "labels": {"team": "ops"}})).json()
    assert relabelled["changed"] == ["labels"] and relabelled["next_run_at"] == created["next_run_at"]
    assert await keys_of(client, auth, "/v1/schedules", "team=ops") == {"sync"}
    assert await keys_of(client, auth, "/v1/schedules", "team=payments") == set()
    unlabelled = (await client.put("/v1/schedules/sync", headers=auth, json={**body, "labels": None})).json()
    assert unlabelled["changed"] == ["labels"] and unlabelled["labels"] == {}


async def test_targets_carry_labels_and_the_list_finds_them(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver
) -> None:
    await make_target(client, auth, receiver.url(), name="billing", labels={"team": "payments"})
    await make_target(client, auth, receiver.url(), name="pager", labels={"team": "ops"})
    assert await keys_of(client, auth, "/v1/targets", "team=payments") == {"billing"}
    put = await client.put(
        "/v1/targets/by-name/billing", headers=auth, json={"url": receiver.url(), "labels": {"team": "ops"}}
    )
    assert put.status_code == 200 and put.json()["changed"] == ["labels"], put.text
    assert await keys_of(client, auth, "/v1/targets", "team=ops") == {"billing", "pager"}
    assert_problem(await client.get("/v1/targets", headers=auth, params={"label": "no-equals"}), 422, "label")


async def test_dead_letters_are_found_by_their_jobs_labels(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine, settings: Settings
) -> None:
    # Port 9 (discard) refuses: each job's one attempt fails and is dead-lettered.
    target = await make_target(client, auth, "http://127.0.0.1:9/hook")
    pay = await make_job(client, auth, target["id"], max_attempts=1, name="pay", labels={"team": "payments"})
    await make_job(client, auth, target["id"], max_attempts=1, name="ops", labels={"team": "ops"})
    scheduler = Scheduler(engine, SchedulerConfig.from_settings(settings), TEST_KEY_RING)

    async def both_dead() -> bool:
        await scheduler.run_once()
        return len((await client.get("/v1/dead-letters", headers=auth)).json()["items"]) == 2

    try:
        await wait_for(both_dead, message="two dead letters")
    finally:
        await scheduler.close(grace_s=5)
    found = (await client.get("/v1/dead-letters", headers=auth, params={"label": "team=payments"})).json()["items"]
    assert [letter["job_id"] for letter in found] == [pay["id"]]
