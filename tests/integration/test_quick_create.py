"""The quick branch of `POST /v1/jobs` (app/api/job_creates.py, QuickCreate) answers exactly
as the FastAPI route's full handler does.

Each request goes to two apps on one database: the service as built, and the same app without
the quick branch (only the route's full handler). Their answers must match in status, content
type, the headers a client acts on, and body (ids and times aside); the quick branch must have
served the requests it is meant for, and left the others to the full handler.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from pydantic import SecretStr
from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.app import create_app
from app.api.job_creates import QuickCreate
from app.settings import Settings
from app.store.tables import api_keys, audit_log, jobs
from app.store.tenants import hash_api_key
from tests.conftest import make_target, new_tenant

ADMIN_KEY = "admin-key-for-quick-create-tests"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
# What differs between two correct answers: new ids, and the moments of creation.
JSON = "application/json"
VOLATILE = frozenset({"id", "created_at", "updated_at"})


# The service's client, a client of the route alone, and the paths the quick branch served.
Apps = tuple[httpx.AsyncClient, httpx.AsyncClient, list[str]]


@pytest.fixture
async def apps(settings: Settings, engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Apps]:
    settings = settings.model_copy(update={"admin_api_key": SecretStr(ADMIN_KEY), "max_payload_bytes": 2048})
    served: list[str] = []
    original = QuickCreate._create

    async def counting(self: QuickCreate, *args: Any) -> Any:
        served.append("/v1/jobs")
        return await original(self, *args)

    monkeypatch.setattr(QuickCreate, "_create", counting)
    service = create_app(settings, engine=engine)
    route_only = create_app(settings, engine=engine)
    route_only.state.quick_create = None
    clients = [
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://cronhook.test")
        for app in (service, route_only)
    ]
    async with clients[0] as first, clients[1] as second:
        yield first, second, served


def _comparable(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    if isinstance(body, dict):
        body = {key: value for key, value in body.items() if key not in VOLATILE}
    return {
        "status": response.status_code,
        "content-type": response.headers.get("content-type"),
        "www-authenticate": response.headers.get("www-authenticate"),
        "retry-after": "Retry-After" in response.headers,
        "body": body,
    }


async def _both(apps: Apps, **request: Any) -> tuple[dict[str, Any], bool]:
    """Sends the request to both apps; (the service's answer, whether the quick branch served it)."""
    service, route_only, served = apps
    before = len(served)
    first = await service.post("/v1/jobs", **request)
    second = await route_only.post("/v1/jobs", **request)
    assert len(served) == before or len(served) == before + 1
    assert _comparable(first) == _comparable(second), (first.text, second.text)
    return _comparable(first), len(served) > before


async def _tenant_with_target(client: httpx.AsyncClient, engine: AsyncEngine) -> tuple[dict[str, str], dict[str, Any]]:
    auth = await new_tenant(engine)
    return auth, await make_target(client, auth, "http://127.0.0.1:9/hook")


async def test_the_quick_branch_and_the_route_answer_alike(apps: Apps, engine: AsyncEngine) -> None:
    service, _, _ = apps
    auth, target = await _tenant_with_target(service, engine)
    run_at = (dt.datetime.now(dt.UTC) + dt.timedelta(days=2)).replace(microsecond=0).isoformat()

    def job(**fields: Any) -> dict[str, Any]:
        return {"target_id": target["id"], "payload": {"n": 1}, "run_at": run_at, **fields}

    revoked = await new_tenant(engine)
    other_tenant = await new_tenant(engine)
    foreign = await make_target(service, other_tenant, "http://127.0.0.1:9/other")
    async with engine.begin() as conn:
        revoked_hash = hash_api_key(revoked["Authorization"].removeprefix("Bearer "))
        await conn.execute(update(api_keys).where(api_keys.c.key_hash == revoked_hash).values(revoked_at=func.now()))
    quick_cases: list[tuple[str, dict[str, Any], int]] = [
        ("one-off", {"json": job(), "headers": auth}, 201),
        (
            "cron in a zone",
            {"json": job(run_at=None, cron="30 7 * * 1-5", timezone="Europe/Berlin"), "headers": auth},
            201,
        ),
        (
            "every, from start_at",
            {"json": job(run_at=None, every_s=90, start_at=run_at, priority=3, max_attempts=4), "headers": auth},
            201,
        ),
        ("charset", {"json": job(), "headers": {**auth, "Content-Type": "application/json; charset=utf-8"}}, 201),
        # HTTPBearer strips what follows "Bearer ": so does the quick branch.
        (
            "spaced key",
            {"json": job(), "headers": {"Authorization": auth["Authorization"].replace(" ", " \t ") + " "}},
            201,
        ),
        ("unknown target", {"json": job(target_id=str(uuid.uuid4())), "headers": auth}, 422),
        ("another tenant's target", {"json": job(target_id=foreign["id"]), "headers": auth}, 422),
        ("bad cron", {"json": job(run_at=None, cron="61 * * * *"), "headers": auth}, 422),
        ("bad zone", {"json": job(run_at=None, cron="0 9 * * *", timezone="Mars/Olympus"), "headers": auth}, 422),
        ("payload over the limit", {"json": job(payload={"x": "y" * 3000}), "headers": auth}, 413),
        ("unknown key", {"json": job(), "headers": {"Authorization": "Bearer chk_not_a_real_key_at_all_000"}}, 401),
        ("revoked key", {"json": job(), "headers": revoked}, 401),
        # The model accepts these; planning the job refuses them (PlanError's handler).
        ("two schedules", {"json": job(delay_s=5), "headers": auth}, 422),
        ("no schedule", {"json": {"target_id": target["id"], "payload": {}}, "headers": auth}, 422),
    ]
    for name, request, status in quick_cases:
        answer, served = await _both(apps, **request)
        assert answer["status"] == status, (name, answer)
        assert served, f"{name}: the quick branch should have served this request"

    route_cases: list[tuple[str, dict[str, Any], int]] = [
        ("no key", {"json": job()}, 401),
        ("another scheme", {"json": job(), "headers": {"Authorization": "Basic dXNlcjpwdw=="}}, 401),
        (
            "malformed JSON",
            {"content": b'{"target_id": ', "headers": {**auth, "Content-Type": "application/json"}},
            400,
        ),
        ("not JSON", {"content": b"target_id=1", "headers": {**auth, "Content-Type": "text/plain"}}, 422),
        ("unknown field", {"json": job(colour="red"), "headers": auth}, 422),
        (
            "two content types",
            {
                "content": json.dumps(job()).encode(),
                "headers": [*auth.items(), ("Content-Type", "text/plain"), ("Content-Type", JSON)],
            },
            422,
        ),
    ]
    for name, request, status in route_cases:
        answer, served = await _both(apps, **request)
        assert answer["status"] == status, (name, answer)
        assert not served, f"{name}: the route should have answered this request"


async def test_dedup_conflicts_and_audit_rows_match(apps: Apps, engine: AsyncEngine) -> None:
    service, route_only, served = apps
    auth, target = await _tenant_with_target(service, engine)
    body = {"target_id": target["id"], "payload": {}, "delay_s": 3600, "dedup_key": "nightly"}
    created = await service.post("/v1/jobs", json=body, headers={**auth, "X-Request-Id": "quick-1"})
    assert created.status_code == 201 and served == ["/v1/jobs"]
    # The holder of the key is named alike by both.
    answer, _ = await _both(apps, json=body, headers=auth)
    assert answer["status"] == 409 and answer["body"]["job_id"] == created.json()["id"]
    # One job, and its audit row (with the request id) written with it, as the route does.
    async with engine.connect() as conn:
        assert await conn.scalar(select(func.count()).select_from(jobs).where(jobs.c.dedup_key == "nightly")) == 1
        row = (await conn.execute(select(audit_log).where(audit_log.c.object_id == created.json()["id"]))).one()
    assert (row.action, row.request_id, row.actor) == ("createJob", "quick-1", "api_key")
    # The request id is echoed, as on every answer.
    again = await route_only.post("/v1/jobs", json={**body, "dedup_key": "other"}, headers=auth)
    assert again.status_code == 201 and again.headers["x-request-id"]


async def test_an_idempotency_key_goes_to_the_route_and_rate_limits_hold_on_both(
    apps: Apps, engine: AsyncEngine
) -> None:
    service, route_only, served = apps
    auth, target = await _tenant_with_target(service, engine)
    body = {"target_id": target["id"], "payload": {}, "delay_s": 60}
    keyed = {**auth, "Idempotency-Key": "create-once"}
    first = await service.post("/v1/jobs", json=body, headers=keyed)
    replay = await service.post("/v1/jobs", json=body, headers=keyed)
    assert first.status_code == replay.status_code == 201 and served == []
    assert replay.headers["Idempotent-Replayed"] == "true" and replay.json()["id"] == first.json()["id"]

    # One tenant per app, each allowed 1 request/s: both refuse alike once the burst is spent.
    def limited(client: httpx.AsyncClient) -> Callable[[], Any]:
        async def tenant() -> dict[str, str]:
            name = f"limited-{uuid.uuid4().hex[:8]}"
            key = (await client.post(f"/v1/admin/tenants/{name}/api-keys", headers=ADMIN)).json()["key"]
            limits = await client.put(f"/v1/admin/tenants/{name}/limits", json={"requests_per_s": 1}, headers=ADMIN)
            assert limits.status_code == 200, limits.text
            return {"Authorization": f"Bearer {key}"}

        return tenant

    refusals = []
    for client in (service, route_only):
        tenant_auth = await limited(client)()
        tenant_target = await make_target(client, tenant_auth, "http://127.0.0.1:9/hook")
        job = {**body, "target_id": tenant_target["id"]}
        for _ in range(20):
            response = await client.post("/v1/jobs", json=job, headers=tenant_auth)
            if response.status_code == 429:
                refusals.append(_comparable(response))
                break
            assert response.status_code == 201, response.text
        else:
            pytest.fail("20 creates in a row at 1 request/s were all admitted")
    assert refusals[0]["body"]["type"] == "urn:cronhook:problem:rate-limited" and refusals[0]["retry-after"]
    assert refusals[0] == refusals[1]
