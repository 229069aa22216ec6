"""dedup_key: unique among a tenant's unfinished jobs."""

from __future__ import annotations

import asyncio

import httpx
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store.tables import jobs
from tests.conftest import make_target, new_tenant
from tests.problems import assert_problem


async def job_count(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int(await conn.scalar(select(func.count()).select_from(jobs)) or 0)


async def test_a_second_create_with_the_key_is_a_409_naming_the_job(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine
) -> None:
    target = await make_target(client, auth, "http://127.0.0.1:9/hook")
    body = {"target_id": target["id"], "delay_s": 60, "dedup_key": "invoice-42"}
    first = await client.post("/v1/jobs", json=body, headers=auth)
    assert first.status_code == 201 and first.json()["dedup_key"] == "invoice-42"
    second = await client.post("/v1/jobs", json={**body, "payload": {"other": True}}, headers=auth)
    assert second.status_code == 409 and second.headers["content-type"] == "application/problem+json"
    problem = second.json()
    assert problem["job_id"] == first.json()["id"] and problem["errors"][0]["field"] == "dedup_key"
    assert await job_count(engine) == 1

    # Another tenant's key space is its own; a finished job frees the key.
    other = await new_tenant(engine)
    other_target = await make_target(client, other, "http://127.0.0.1:9/hook")
    assert (
        await client.post("/v1/jobs", json={**body, "target_id": other_target["id"]}, headers=other)
    ).status_code == 201
    await client.post(f"/v1/jobs/{first.json()['id']}/cancel", headers=auth)
    again = await client.post("/v1/jobs", json=body, headers=auth)
    assert again.status_code == 201 and again.json()["id"] != first.json()["id"]

    patched = await client.patch(f"/v1/jobs/{again.json()['id']}", json={"dedup_key": "x"}, headers=auth)
    assert_problem(patched, 422, "dedup_key")


async def test_concurrent_creates_with_one_key_make_one_job(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine
) -> None:
    target = await make_target(client, auth, "http://127.0.0.1:9/hook")
    body = {"target_id": target["id"], "delay_s": 60, "dedup_key": "nightly"}
    responses = await asyncio.gather(*(client.post("/v1/jobs", json=body, headers=auth) for _ in range(8)))
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [201] + [409] * 7
    winner = next(r for r in responses if r.status_code == 201).json()["id"]
    assert {r.json()["job_id"] for r in responses if r.status_code == 409} == {winner}
    assert await job_count(engine) == 1
