"""The audit log (issue 11 item 8) and bounded list pages (item 6)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.schemas.pages import PAGE_PAYLOAD_BUDGET
from tests.conftest import make_job, make_target, new_tenant


async def _audit(client: httpx.AsyncClient, auth: dict[str, str], **params: Any) -> dict[str, Any]:
    response = await client.get("/v1/audit", params=params, headers=auth)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def test_every_mutation_is_audited_with_key_request_id_and_object_and_nothing_secret(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine
) -> None:
    target = await make_target(client, auth, "http://127.0.0.1:9/hook", headers={"Authorization": "Bearer tok-123"})
    job = await make_job(client, auth, target["id"], delay_s=3600, payload={"card": "4111-1111"})
    await client.patch(f"/v1/jobs/{job['id']}", json={"priority": 3}, headers=auth)
    await client.post(f"/v1/jobs/{job['id']}/cancel", headers={**auth, "X-Request-Id": "req-42"})
    await client.post(f"/v1/targets/{target['id']}/rotate-secret", headers=auth)
    # Refused and read-only requests leave no entry.
    await client.post("/v1/jobs", json={"target_id": target["id"]}, headers=auth)
    await client.get(f"/v1/jobs/{job['id']}", headers=auth)

    items = (await _audit(client, auth))["items"]
    assert [(i["action"], i["object_id"]) for i in reversed(items)] == [
        ("createTarget", target["id"]),
        ("createJob", job["id"]),
        ("updateJob", job["id"]),
        ("cancelJob", job["id"]),
        ("rotateTargetSecret", target["id"]),
    ]
    assert len({i["api_key_id"] for i in items}) == 1 and items[0]["api_key_id"] is not None
    assert items[1]["request_id"] == "req-42"
    assert all(i["request_id"] for i in items)
    async with engine.connect() as conn:
        dump = "\n".join((await conn.execute(text("SELECT a::text FROM audit_log a"))).scalars())
    for secret in ("tok-123", "4111-1111", target["secret"]):
        assert secret not in dump

    # Another tenant sees none of it.
    assert (await _audit(client, await new_tenant(engine)))["items"] == []


async def test_the_audit_log_pages_and_cannot_be_rewritten(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine
) -> None:
    for index in range(5):
        await make_target(client, auth, f"http://127.0.0.1:9/{index}")
    first = await _audit(client, auth, limit=3)
    second = await _audit(client, auth, limit=3, cursor=first["next_cursor"])
    assert len(first["items"]) == 3 and len(second["items"]) == 2 and second["next_cursor"] is None
    assert [i["id"] for i in first["items"] + second["items"]] == sorted(
        (i["id"] for i in first["items"] + second["items"]), reverse=True
    )
    for statement in ("UPDATE audit_log SET action = 'x'", "DELETE FROM audit_log"):
        with pytest.raises(DBAPIError, match="append-only"):
            async with engine.begin() as conn:
                await conn.execute(text(statement))


async def test_lists_return_payloads_only_on_request_and_bound_the_page(
    client: httpx.AsyncClient, auth: dict[str, str]
) -> None:
    target = await make_target(client, auth, "http://127.0.0.1:9/hook")
    big = {"blob": "x" * (200 * 1024)}
    created = [await make_job(client, auth, target["id"], delay_s=3600, payload=big) for _ in range(8)]
    plain = (await client.get("/v1/jobs", params={"limit": 200}, headers=auth)).json()
    assert len(plain["items"]) == 8 and all(item["payload"] is None for item in plain["items"])

    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 200, "include": "payload"}
        if cursor:
            params["cursor"] = cursor
        page = (await client.get("/v1/jobs", params=params, headers=auth)).json()
        assert all(item["payload"] == big for item in page["items"])
        assert len(page["items"]) * 200 * 1024 <= PAGE_PAYLOAD_BUDGET + 200 * 1024
        seen += [item["id"] for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [job["id"] for job in reversed(created)]
    assert (await client.get("/v1/jobs", params={"include": "runs"}, headers=auth)).status_code == 422
