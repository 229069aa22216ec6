"""The targets API: secrets shown once, redacted headers, validation, delete rules."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store.claims import job_claim_due
from app.store.tables import targets
from tests.conftest import TEST_KEY_RING, make_job, make_target, new_tenant
from tests.problems import assert_problem


async def test_secret_appears_only_on_create_and_rotate(client: httpx.AsyncClient, auth: dict[str, str]) -> None:
    created = await make_target(
        client, auth, "https://example.test/hook", headers={"Authorization": "Bearer s3cr3t-token"}, timeout_s=2
    )
    secret = created["secret"]
    assert secret.startswith("whsec_")
    assert created["headers"] == {"Authorization": "<redacted>"}
    assert created["timeout_s"] == 2

    fetched = await client.get(f"/v1/targets/{created['id']}", headers=auth)
    listed = await client.get("/v1/targets", headers=auth)
    for text in (fetched.text, listed.text):
        assert secret not in text and "s3cr3t-token" not in text and "secret" not in text

    rotated = await client.post(f"/v1/targets/{created['id']}/rotate-secret", headers=auth)
    assert rotated.status_code == 200
    assert rotated.json()["secret"].startswith("whsec_") and rotated.json()["secret"] != secret


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "x", "url": "ftp://example.test/"}, "url"),
        ({"name": "x", "url": "not a url"}, "url"),
        ({"name": "x", "url": "http://user:pw@example.test/"}, "url"),
        ({"name": "x", "url": "http://example.test:99999/"}, "url"),
        ({"name": "", "url": "http://example.test/"}, "name"),
        ({"url": "http://example.test/"}, "name"),
        ({"name": "x", "url": "http://example.test/", "headers": {"webhook-id": "x"}}, "headers"),
        ({"name": "x", "url": "http://example.test/", "headers": {"Host": "evil"}}, "headers"),
        ({"name": "x", "url": "http://example.test/", "headers": {"X-A": "a\r\nb"}}, "headers"),
        ({"name": "x", "url": "http://example.test/", "timeout_s": 0}, "timeout_s"),
        ({"name": "x", "url": "http://example.test/", "timeout_s": 99}, "timeout_s"),
        ({"name": "x", "url": "http://example.test/", "extra": 1}, "extra"),
        ({"name": "a\u0000b", "url": "http://example.test/"}, "name"),
        ({"name": "x", "url": "http://example.test/\u0000"}, "url"),
        ({"name": "x", "url": "http://example.test/a b"}, "url"),
        ({"name": "x", "url": "http://example.test/", "headers": {"X-A": "a\u0001b"}}, "headers"),
        ({"name": "x", "url": "http://example.test/", "headers": {"X-A": "caf\u00e9"}}, "headers"),
    ],
)
async def test_bad_target_input_names_the_field_and_writes_nothing(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine, body: dict[str, Any], field: str
) -> None:
    response = await client.post("/v1/targets", json=body, headers=auth)
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert any(e["field"].split(".")[0] == field for e in response.json()["errors"]), response.json()
    async with engine.connect() as conn:
        assert await conn.scalar(select(func.count()).select_from(targets)) == 0


async def test_patch_changes_only_given_fields(client: httpx.AsyncClient, auth: dict[str, str]) -> None:
    target = await make_target(client, auth, "http://example.test/a", headers={"X-Team": "blue"})
    response = await client.patch(f"/v1/targets/{target['id']}", json={"url": "http://example.test/b"}, headers=auth)
    assert response.status_code == 200
    body = response.json()
    assert body["url"] == "http://example.test/b" and body["name"] == target["name"]
    assert body["headers"] == {"X-Team": "<redacted>"}
    bad = await client.patch(f"/v1/targets/{target['id']}", json={"url": "gopher://x"}, headers=auth)
    assert_problem(bad, 422, "url")
    null_name = await client.patch(f"/v1/targets/{target['id']}", json={"name": None}, headers=auth)
    assert null_name.status_code == 422 and null_name.json()["errors"][0]["field"] == "name"


async def test_a_targets_running_jobs_count_as_active_beside_its_waiting_ones(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine
) -> None:
    # Waiting and running jobs are counted by two indexes (migration 0026): both must count,
    # and another target's jobs must not.
    target = await make_target(client, auth, "http://example.test/a")
    other = await make_target(client, auth, "http://example.test/b")
    await make_job(client, auth, other["id"], delay_s=600)
    await make_job(client, auth, target["id"], delay_s=600)
    await make_job(client, auth, target["id"])  # due at once: claimed below
    async with engine.begin() as conn:
        (claimed,) = await job_claim_due(conn, TEST_KEY_RING, "replica-a", 10, 300)
    assert str(claimed.target_id) == target["id"]
    refused = await client.delete(f"/v1/targets/{target['id']}", headers=auth)
    assert refused.status_code == 409 and refused.json()["active_jobs"] == 2


async def test_delete_refuses_while_jobs_are_active_then_succeeds(
    client: httpx.AsyncClient, auth: dict[str, str]
) -> None:
    target = await make_target(client, auth, "http://example.test/a")
    job = await make_job(client, auth, target["id"], delay_s=600)
    refused = await client.delete(f"/v1/targets/{target['id']}", headers=auth)
    assert refused.status_code == 409 and refused.json()["active_jobs"] == 1
    await client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth)
    assert (await client.delete(f"/v1/targets/{target['id']}", headers=auth)).status_code == 204
    assert (await client.get(f"/v1/targets/{target['id']}", headers=auth)).status_code == 404
    assert (await client.delete(f"/v1/targets/{target['id']}", headers=auth)).status_code == 404
    # A deleted target takes no new jobs.
    response = await client.post("/v1/jobs", json={"target_id": target["id"], "delay_s": 1}, headers=auth)
    assert_problem(response, 422, "target_id")


async def test_other_tenants_cannot_touch_a_target(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine
) -> None:
    target = await make_target(client, auth, "http://example.test/a")
    other = await new_tenant(engine)
    path = f"/v1/targets/{target['id']}"
    assert (await client.patch(path, json={"name": "mine"}, headers=other)).status_code == 404
    assert (await client.delete(path, headers=other)).status_code == 404
    assert (await client.post(f"{path}/rotate-secret", headers=other)).status_code == 404
    assert (await client.get(path, headers=auth)).json()["name"] == target["name"]


async def test_delivery_limits_are_validated_set_and_cleared(client: httpx.AsyncClient, auth: dict[str, str]) -> None:
    for bad, field in (({"max_in_flight": 0}, "max_in_flight"), ({"rate_per_s": -1}, "rate_per_s")):
        response = await client.post("/v1/targets", json={"name": "t", "url": "http://x.test/", **bad}, headers=auth)
        assert_problem(response, 422, field)
    created = await client.post(
        "/v1/targets",
        json={"name": "t", "url": "http://x.test/", "max_in_flight": 4, "rate_per_s": 2.5},
        headers=auth,
    )
    assert (created.json()["max_in_flight"], created.json()["rate_per_s"]) == (4, 2.5)
    cleared = await client.patch(f"/v1/targets/{created.json()['id']}", json={"max_in_flight": None}, headers=auth)
    assert (cleared.json()["max_in_flight"], cleared.json()["rate_per_s"]) == (None, 2.5)
