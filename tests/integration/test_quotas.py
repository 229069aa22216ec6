"""Per-tenant quotas and abuse limits (issue 11 item 4): overrides through the admin API,
refusals that name the field and write nothing, a request rate shared by API replicas, and
failed-authentication throttling per client address."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from sqlalchemy import FromClause, func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.app import create_app
from app.settings import Settings
from app.store.tables import audit_log, jobs, targets
from tests.conftest import ADMIN, make_target


def _client(settings: Settings, engine: AsyncEngine) -> httpx.AsyncClient:
    app = create_app(settings, engine=engine)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://cronhook.test")


@pytest.fixture
def api(admin_client: httpx.AsyncClient) -> httpx.AsyncClient:
    """The API with the admin key set (tenant keys and limits)."""
    return admin_client


async def _tenant(api: httpx.AsyncClient, name: str, **limits: Any) -> dict[str, str]:
    key = (await api.post(f"/v1/admin/tenants/{name}/api-keys", headers=ADMIN)).json()["key"]
    if limits:
        response = await api.put(f"/v1/admin/tenants/{name}/limits", json=limits, headers=ADMIN)
        assert response.status_code == 200, response.text
        assert all(response.json()["effective"][field] == value for field, value in limits.items())
    return {"Authorization": f"Bearer {key}"}


async def _count(engine: AsyncEngine, table: FromClause) -> int:
    async with engine.connect() as conn:
        return int(await conn.scalar(select(func.count()).select_from(table)) or 0)


async def test_target_and_active_job_limits_refuse_with_409_and_write_nothing(
    api: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    auth = await _tenant(api, "small", max_targets=1, max_active_jobs=2)
    target = await make_target(api, auth, "http://127.0.0.1:9/hook")
    refused = await api.post("/v1/targets", json={"name": "b", "url": "http://127.0.0.1:9/b"}, headers=auth)
    assert refused.status_code == 409 and refused.json()["type"] == "urn:cronhook:problem:quota-exceeded"
    assert refused.headers["content-type"].startswith("application/problem+json")
    assert await _count(engine, targets) == 1

    body = {"target_id": target["id"], "payload": {}, "delay_s": 3600}
    for _ in range(2):
        assert (await api.post("/v1/jobs", json=body, headers=auth)).status_code == 201
    refused = await api.post("/v1/jobs", json=body, headers=auth)
    assert refused.status_code == 409 and "2 unfinished jobs" in refused.json()["detail"]
    assert await _count(engine, jobs) == 2
    # A finished job frees its place (after the replica's short count cache).
    job_id = (await api.get("/v1/jobs", headers=auth)).json()["items"][0]["id"]
    assert (await api.post(f"/v1/jobs/{job_id}/cancel", headers=auth)).status_code == 200
    await api.put("/v1/admin/tenants/small/limits", json={"max_targets": 1, "max_active_jobs": 2}, headers=ADMIN)
    assert (await api.post("/v1/jobs", json=body, headers=auth)).status_code == 201


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"every_s": 30}, "every_s"),
        ({"cron": "* * * * *"}, "cron"),
        ({"cron": "*/10 * * * * *"}, "cron"),
        ({"delay_s": 1, "backoff_base_s": 0.5}, "backoff_base_s"),
        ({"delay_s": 1, "max_attempts": 11}, "max_attempts"),
    ],
)
async def test_schedule_and_retry_floors_are_a_422_naming_the_field(
    api: httpx.AsyncClient, engine: AsyncEngine, fields: dict[str, Any], field: str
) -> None:
    auth = await _tenant(api, "strict", min_interval_s=300, min_backoff_base_s=1.0, max_attempts=10)
    target = await make_target(api, auth, "http://127.0.0.1:9/hook")
    response = await api.post("/v1/jobs", json={"target_id": target["id"], "payload": {}, **fields}, headers=auth)
    assert response.status_code == 422, response.text
    assert response.json()["errors"][0]["field"] == field
    assert await _count(engine, jobs) == 0


async def test_patch_cannot_go_below_the_floors(api: httpx.AsyncClient) -> None:
    auth = await _tenant(api, "patchy", min_interval_s=300)
    target = await make_target(api, auth, "http://127.0.0.1:9/hook")
    job = (
        await api.post("/v1/jobs", json={"target_id": target["id"], "payload": {}, "every_s": 600}, headers=auth)
    ).json()
    response = await api.patch(f"/v1/jobs/{job['id']}", json={"every_s": 60}, headers=auth)
    assert response.status_code == 422 and response.json()["errors"][0]["field"] == "every_s"
    assert (await api.get(f"/v1/jobs/{job['id']}", headers=auth)).json()["every_s"] == 600


async def test_the_request_rate_is_shared_by_replicas_and_answers_429_with_retry_after(
    api: httpx.AsyncClient, settings: Settings, engine: AsyncEngine
) -> None:
    auth = await _tenant(api, "chatty", requests_per_s=5)
    other = await _tenant(api, "quiet")
    async with _client(settings, engine) as second_replica:
        replicas = [api, second_replica]
        started = time.monotonic()
        statuses = []
        for index in range(40):
            response = await replicas[index % 2].get("/v1/targets", headers=auth)
            statuses.append(response.status_code)
            if response.status_code == 429:
                assert int(response.headers["Retry-After"]) >= 1
                assert response.json()["type"] == "urn:cronhook:problem:rate-limited"
        elapsed = time.monotonic() - started
        admitted = statuses.count(200)
        # Both replicas together: at most the burst (2 s worth) plus what accrued meanwhile.
        assert statuses.count(429) > 0
        assert admitted <= 10 + 5 * elapsed + 1, (admitted, elapsed)
        # Another tenant is not affected.
        assert (await second_replica.get("/v1/targets", headers=other)).status_code == 200


async def test_failed_authentications_are_throttled_per_address(settings: Settings, engine: AsyncEngine) -> None:
    settings.failed_auth_per_min = 3
    async with _client(settings, engine) as http:
        bad = {"Authorization": "Bearer chk_not_a_real_key_at_all_000"}
        statuses = [(await http.get("/v1/targets", headers=bad)).status_code for _ in range(5)]
        assert statuses[:3] == [401, 401, 401] and statuses[3:] == [429, 429]
        throttled = await http.get("/v1/targets", headers=bad)
        assert throttled.json()["type"] == "urn:cronhook:problem:auth-throttled"
        assert int(throttled.headers["Retry-After"]) >= 1


async def test_concurrent_requests_never_exhaust_the_pool(api: httpx.AsyncClient, engine: AsyncEngine) -> None:
    """Refills take their own connection before the request takes one: 60 concurrent
    requests on a 5-connection pool all finish."""
    auth = await _tenant(api, "busy", requests_per_s=10_000)
    responses = await asyncio.wait_for(
        asyncio.gather(*(api.get("/v1/targets", headers=auth) for _ in range(60))), timeout=30
    )
    assert {r.status_code for r in responses} == {200}


async def test_triggers_count_against_the_unfinished_jobs_limit(api: httpx.AsyncClient, engine: AsyncEngine) -> None:
    auth = await _tenant(api, "triggers", max_active_jobs=1)
    target = await make_target(api, auth, "http://127.0.0.1:9/hook")
    job = (
        await api.post("/v1/jobs", json={"target_id": target["id"], "payload": {}, "every_s": 3600}, headers=auth)
    ).json()
    response = await api.post(f"/v1/jobs/{job['id']}/trigger", headers=auth)
    assert response.status_code == 409 and response.json()["type"] == "urn:cronhook:problem:quota-exceeded"
    assert await _count(engine, jobs) == 1


async def test_a_batch_is_held_to_the_quotas_as_a_whole_and_audited_once(
    api: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    auth = await _tenant(api, "batcher", max_active_jobs=3, min_interval_s=300)
    target = await make_target(api, auth, "http://127.0.0.1:9/hook")
    job = {"target_id": target["id"], "payload": {}, "delay_s": 3600}
    too_many = await api.post("/v1/jobs/batch", json={"jobs": [job] * 4}, headers=auth)
    assert too_many.status_code == 409 and too_many.json()["type"] == "urn:cronhook:problem:quota-exceeded"
    too_often = await api.post(
        "/v1/jobs/batch", json={"jobs": [job, {**job, "delay_s": None, "every_s": 60}]}, headers=auth
    )
    assert too_often.status_code == 422 and too_often.json()["errors"][0]["field"] == "jobs[1].every_s"
    assert await _count(engine, jobs) == 0
    created = await api.post("/v1/jobs/batch", json={"jobs": [job] * 3}, headers={**auth, "X-Request-Id": "batch-1"})
    assert created.status_code == 201, created.text
    assert await _count(engine, jobs) == 3
    entries = (await api.get("/v1/audit", headers=auth)).json()["items"]
    assert [(e["action"], e["request_id"]) for e in entries if e["action"] == "createJobs"] == [
        ("createJobs", "batch-1")
    ]


async def test_the_single_create_is_rate_limited_too(api: httpx.AsyncClient, engine: AsyncEngine) -> None:
    auth = await _tenant(api, "eager", requests_per_s=2)
    target = await make_target(api, auth, "http://127.0.0.1:9/hook")
    body = {"target_id": target["id"], "payload": {}, "delay_s": 3600}
    statuses = [(await api.post("/v1/jobs", json=body, headers=auth)).status_code for _ in range(12)]
    assert 429 in statuses and statuses.count(201) >= 1
    # Every 201 is a job with its audit row; a 429 wrote nothing.
    assert await _count(engine, jobs) == statuses.count(201)
    async with engine.connect() as conn:
        audited = await conn.scalar(
            select(func.count()).select_from(audit_log).where(audit_log.c.action == "createJob")
        )
    assert audited == statuses.count(201)
