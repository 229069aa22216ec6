"""POST /v1/jobs/batch: all-or-nothing validation naming `jobs[i].field`, per-item dedup_key
conflicts, one Idempotency-Key for the whole batch, and tenant isolation."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.settings import Settings
from app.store.quotas import tenant_limits_set
from app.store.tables import jobs
from app.store.tenants import api_key_create, tenant_ensure
from tests.conftest import make_job, make_target, new_tenant
from tests.problems import assert_problem

URL = "http://127.0.0.1:9/hook"
BATCH = "/v1/jobs/batch"


async def job_count(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int(await conn.scalar(select(func.count()).select_from(jobs)) or 0)


@pytest.fixture
async def target(client: httpx.AsyncClient, auth: dict[str, str]) -> dict[str, Any]:
    return await make_target(client, auth, URL)


def item(target: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"target_id": target["id"], "payload": {"n": 1}, "delay_s": 60, **fields}


async def test_a_batch_creates_every_job_in_order(
    client: httpx.AsyncClient, auth: dict[str, str], target: dict[str, Any], engine: AsyncEngine
) -> None:
    run_at = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=2)).replace(microsecond=0)
    body = {
        "jobs": [
            item(target, run_at=run_at.isoformat(), delay_s=None, name="once"),
            item(target, cron="0 9 * * *", timezone="Europe/Paris", delay_s=None, misfire_policy="skip"),
            item(target, every_s=30, delay_s=None, payload={"items": [1, "two", None]}),
        ]
    }
    response = await client.post(BATCH, json=body, headers=auth)
    assert response.status_code == 201, response.text
    result = response.json()
    assert result["created"] == 3 and result["conflicts"] == 0
    assert [i["index"] for i in result["items"]] == [0, 1, 2]
    assert all(i["status"] == 201 and i["problem"] is None for i in result["items"])
    assert dt.datetime.fromisoformat(result["items"][0]["next_run_at"]) == run_at
    # Each job reads back as a single create would have made it.
    first, second, third = [(await client.get(f"/v1/jobs/{i['id']}", headers=auth)).json() for i in result["items"]]
    assert first["name"] == "once" and first["schedule_kind"] == "once"
    assert second["cron"] == "0 9 * * *" and second["timezone"] == "Europe/Paris"
    assert second["misfire_policy"] == "skip" and second["next_run_at"] == result["items"][1]["next_run_at"]
    assert third["every_s"] == 30 and third["payload"] == {"items": [1, "two", None]}
    assert third["interval_mode"] == "fixed_rate"
    assert await job_count(engine) == 3


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"cron": "61 * * * *", "delay_s": None}, "jobs[1].cron"),
        ({"every_s": 0, "delay_s": None}, "jobs[1].every_s"),
        ({"misfire_policy": "skip"}, "jobs[1].misfire_policy"),  # recurring jobs only: the plan refuses it
        ({"surprise": True}, "jobs[1].surprise"),
    ],
)
async def test_one_invalid_job_refuses_the_whole_batch_naming_it(
    client: httpx.AsyncClient,
    auth: dict[str, str],
    target: dict[str, Any],
    engine: AsyncEngine,
    bad: dict[str, Any],
    field: str,
) -> None:
    body = {"jobs": [item(target), item(target, **bad), item(target)]}
    response = await client.post(BATCH, json=body, headers=auth)
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert field in [e["field"] for e in response.json()["errors"]]
    assert await job_count(engine) == 0


async def test_an_unknown_or_foreign_target_refuses_the_batch(
    client: httpx.AsyncClient, auth: dict[str, str], target: dict[str, Any], engine: AsyncEngine
) -> None:
    other = await new_tenant(engine)
    foreign = await make_target(client, other, URL)
    response = await client.post(BATCH, json={"jobs": [item(target), item(target), item(foreign)]}, headers=auth)
    assert response.status_code == 422
    assert response.json()["errors"] == [{"field": "jobs[2].target_id", "message": "no such target"}]
    assert await job_count(engine) == 0


async def test_size_limits_are_named(client: httpx.AsyncClient, auth: dict[str, str], target: dict[str, Any]) -> None:
    too_many = await client.post(BATCH, json={"jobs": [item(target)] * 1001}, headers=auth)
    assert too_many.status_code == 422 and too_many.json()["errors"][0]["field"] == "jobs"
    empty = await client.post(BATCH, json={"jobs": []}, headers=auth)
    assert_problem(empty, 422, "jobs")


async def test_dedup_conflicts_are_reported_per_item_and_the_rest_is_created(
    client: httpx.AsyncClient, auth: dict[str, str], target: dict[str, Any], engine: AsyncEngine
) -> None:
    holder = await make_job(client, auth, target["id"], delay_s=60, dedup_key="taken")
    body = {
        "jobs": [
            item(target, dedup_key="taken"),
            item(target, dedup_key="fresh"),
            item(target, dedup_key="fresh"),  # the earlier item of the batch wins
            item(target),
        ]
    }
    response = await client.post(BATCH, json=body, headers=auth)
    assert response.status_code == 207, response.text
    result = response.json()
    assert result["created"] == 2 and result["conflicts"] == 2
    statuses = [i["status"] for i in result["items"]]
    assert statuses == [409, 201, 409, 201]
    taken, fresh, repeated = result["items"][0], result["items"][1], result["items"][2]
    assert taken["problem"]["job_id"] == holder["id"] and taken["problem"]["field"] == "jobs[0].dedup_key"
    assert taken["id"] is None
    assert repeated["problem"]["job_id"] == fresh["id"] and repeated["problem"]["field"] == "jobs[2].dedup_key"
    assert await job_count(engine) == 3  # the holder and two new jobs


async def test_an_idempotency_key_replays_the_whole_batch(
    client: httpx.AsyncClient, auth: dict[str, str], target: dict[str, Any], engine: AsyncEngine
) -> None:
    headers = {**auth, "Idempotency-Key": "batch-1"}
    body = {"jobs": [item(target), item(target, dedup_key="k")]}
    first = await client.post(BATCH, json=body, headers=headers)
    again = await client.post(BATCH, json=body, headers=headers)
    assert first.status_code == again.status_code == 201
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json() == first.json()
    assert await job_count(engine) == 2
    changed = await client.post(BATCH, json={"jobs": [item(target)]}, headers=headers)
    assert changed.status_code == 422 and changed.json()["errors"][0]["field"] == "Idempotency-Key"
    assert await job_count(engine) == 2


async def test_a_batch_needs_a_valid_key(client: httpx.AsyncClient, target: dict[str, Any]) -> None:
    response = await client.post(BATCH, json={"jobs": [item(target)]}, headers={"Authorization": "Bearer chk_nope"})
    assert response.status_code == 401


async def test_an_item_over_the_payload_limit_or_a_tenant_floor_is_named(
    client: httpx.AsyncClient, settings: Settings, target: dict[str, Any], engine: AsyncEngine
) -> None:
    settings.max_payload_bytes = 64
    name = f"floors-{uuid.uuid4().hex[:8]}"
    async with engine.begin() as conn:
        tenant_id = await tenant_ensure(conn, name)
        await tenant_limits_set(conn, tenant_id, {"max_attempts": 20})
        auth = {"Authorization": f"Bearer {await api_key_create(conn, tenant_id)}"}
    own = await make_target(client, auth, URL)
    big = await client.post(BATCH, json={"jobs": [item(own), item(own, payload={"x": "y" * 100})]}, headers=auth)
    assert_problem(big, 413, "jobs[1].payload")
    floors = {"jobs": [item(own, max_attempts=20), item(own, max_attempts=21)]}
    over = await client.post(BATCH, json=floors, headers=auth)
    assert_problem(over, 422, "jobs[1].max_attempts")
    assert await job_count(engine) == 0
    fine = await client.post(BATCH, json={"jobs": [item(own, max_attempts=20), item(own)]}, headers=auth)
    assert fine.status_code == 201, fine.text
