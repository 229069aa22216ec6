"""The jobs API on a real database: creation, validation, isolation, listing, cancel."""

from __future__ import annotations

import base64
import datetime as dt
import uuid
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store.tables import jobs
from tests.conftest import make_job, make_target, new_tenant


async def job_count(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int(await conn.scalar(select(func.count()).select_from(jobs)) or 0)


@pytest.fixture
async def target(client: httpx.AsyncClient, auth: dict[str, str]) -> dict[str, Any]:
    return await make_target(client, auth, "http://127.0.0.1:9/hook")


@pytest.mark.date_sensitive
async def test_create_each_schedule_kind(
    client: httpx.AsyncClient, auth: dict[str, str], target: dict[str, Any]
) -> None:
    run_at = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).isoformat()
    once = await make_job(client, auth, target["id"], run_at=run_at)
    assert once["state"] == "scheduled" and once["schedule_kind"] == "once"
    assert dt.datetime.fromisoformat(once["next_run_at"]) == dt.datetime.fromisoformat(run_at)

    delayed = await make_job(client, auth, target["id"], delay_s=30)
    created = dt.datetime.fromisoformat(delayed["created_at"])
    assert (
        dt.timedelta(seconds=29)
        < dt.datetime.fromisoformat(delayed["next_run_at"]) - created
        < dt.timedelta(seconds=31)
    )

    cron = await make_job(client, auth, target["id"], cron="0 9 * * *", timezone="America/New_York")
    next_local = dt.datetime.fromisoformat(cron["next_run_at"]).astimezone(
        __import__("zoneinfo").ZoneInfo("America/New_York")
    )
    assert (next_local.hour, next_local.minute) == (9, 0)
    assert cron["timezone"] == "America/New_York"

    every = await make_job(client, auth, target["id"], every_s=60, priority=7, max_attempts=3, backoff_factor=3)
    assert every["every_s"] == 60 and every["priority"] == 7 and every["max_attempts"] == 3
    assert every["backoff_factor"] == 3 and delayed["backoff_factor"] == 2  # the documented default

    fetched = await client.get(f"/v1/jobs/{every['id']}", headers=auth)
    assert fetched.status_code == 200 and fetched.json() == every


BAD_JOBS: list[tuple[dict[str, Any], int, str]] = [
    ({"cron": "not cron"}, 422, "cron"),
    ({"cron": "0 0 30 2 *"}, 422, "cron"),
    ({"cron": "* * * * *", "timezone": "Nowhere/City"}, 422, "timezone"),
    ({"run_at": "2026-01-01T10:00:00"}, 422, "run_at"),
    ({"run_at": "tomorrow"}, 422, "run_at"),
    ({"delay_s": 0}, 422, "delay_s"),
    ({"delay_s": -5}, 422, "delay_s"),
    ({"every_s": 0}, 422, "every_s"),
    ({"every_s": -1}, 422, "every_s"),
    ({"delay_s": 5, "cron": "* * * * *"}, 422, "cron"),
    ({}, 422, "run_at"),
    ({"delay_s": 5, "colour": "red"}, 422, "colour"),
    ({"delay_s": 5, "priority": 10}, 422, "priority"),
    ({"delay_s": 5, "max_attempts": 0}, 422, "max_attempts"),
    ({"delay_s": 5, "backoff_factor": 0.5}, 422, "backoff_factor"),
    ({"delay_s": 5, "backoff_base_s": 10, "backoff_max_s": 1}, 422, "backoff_max_s"),
    # What JSON accepts but PostgreSQL cannot store, and timestamps out of any sane range.
    ({"delay_s": 5, "name": "a\u0000b"}, 422, "name"),
    ({"delay_s": 5, "payload": {"k": "a\u0000b"}}, 422, "payload"),
    ({"delay_s": 5, "payload": {"a\u0000": 1}}, 422, "payload"),
    ({"run_at": "0001-01-01T00:00:00+05:00"}, 422, "run_at"),
    ({"run_at": "0001-01-01T00:00:00Z"}, 422, "run_at"),
    ({"run_at": "9999-12-31T23:59:59-05:00"}, 422, "run_at"),
    ({"cron": "* * * * *", "timezone": "America"}, 422, "timezone"),
    ({"cron": "0 0 1 1 * 0 2031"}, 422, "cron"),  # a year field: never after 2031
    ({"cron": "R * * * *"}, 422, "cron"),  # croniter's random minute
    ({"cron": "@reboot"}, 422, "cron"),
    ({"cron": "* * * * *", "timezone": "../../etc/passwd"}, 422, "timezone"),
]


@pytest.mark.parametrize(("fields", "status", "field"), BAD_JOBS)
async def test_bad_job_input_is_a_problem_naming_the_field_and_writes_nothing(
    client: httpx.AsyncClient,
    auth: dict[str, str],
    target: dict[str, Any],
    engine: AsyncEngine,
    fields: dict[str, Any],
    status: int,
    field: str,
) -> None:
    response = await client.post("/v1/jobs", json={"target_id": target["id"], "payload": {}, **fields}, headers=auth)
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["status"] == status
    assert field in [e["field"] for e in problem["errors"]], problem
    assert await job_count(engine) == 0


@pytest.mark.date_sensitive
async def test_seconds_field_and_aliases(
    client: httpx.AsyncClient, auth: dict[str, str], target: dict[str, Any]
) -> None:
    every_20s = await make_job(client, auth, target["id"], cron="*/20 * * * * *")
    assert dt.datetime.fromisoformat(every_20s["next_run_at"]).second % 20 == 0
    daily = await make_job(client, auth, target["id"], cron="@daily", timezone="Asia/Kolkata")
    local = dt.datetime.fromisoformat(daily["next_run_at"]).astimezone(__import__("zoneinfo").ZoneInfo("Asia/Kolkata"))
    assert (local.hour, local.minute, local.second) == (0, 0, 0)


async def test_unknown_and_foreign_targets_are_rejected(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine
) -> None:
    other = await new_tenant(engine)
    foreign = await make_target(client, other, "http://127.0.0.1:9/x")
    for target_id in (str(uuid.uuid4()), foreign["id"]):
        response = await client.post("/v1/jobs", json={"target_id": target_id, "delay_s": 1}, headers=auth)
        assert response.status_code == 422
        assert response.json()["errors"][0]["field"] == "target_id"
    response = await client.post("/v1/jobs", json={"target_id": "not-a-uuid", "delay_s": 1}, headers=auth)
    assert response.status_code == 422 and response.json()["errors"][0]["field"] == "target_id"
    assert await job_count(engine) == 0


async def test_oversized_payload_and_body_are_413(
    client: httpx.AsyncClient, auth: dict[str, str], target: dict[str, Any], engine: AsyncEngine, settings: Any
) -> None:
    big = {"blob": "x" * (settings.max_payload_bytes + 10)}
    response = await client.post(
        "/v1/jobs", json={"target_id": target["id"], "delay_s": 1, "payload": big}, headers=auth
    )
    assert response.status_code == 413
    assert response.json()["errors"][0]["field"] == "payload"
    huge = b'{"payload": "' + b"y" * (settings.max_payload_bytes + 100_000) + b'"}'
    response = await client.post("/v1/jobs", content=huge, headers={**auth, "content-type": "application/json"})
    assert response.status_code == 413
    assert await job_count(engine) == 0


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (b'{"delay_s": 5, "payload": {"x": NaN}}', "payload"),
        (b'{"delay_s": 5, "payload": {"x": [Infinity]}}', "payload"),
        (b'{"delay_s": 5, "payload": {"x": "\\ud800"}}', "payload"),
        (b'{"delay_s": 5, "payload": [1, 2]}', "payload"),
    ],
)
async def test_payloads_postgres_cannot_store_are_422(
    client: httpx.AsyncClient,
    auth: dict[str, str],
    target: dict[str, Any],
    engine: AsyncEngine,
    raw: bytes,
    field: str,
) -> None:
    body = raw.replace(b"{", b'{"target_id": "' + target["id"].encode() + b'", ', 1)
    response = await client.post("/v1/jobs", content=body, headers={**auth, "content-type": "application/json"})
    assert response.status_code == 422, response.text
    assert response.json()["errors"][0]["field"] == field
    assert await job_count(engine) == 0


async def test_out_of_range_cursors_are_400(client: httpx.AsyncClient, auth: dict[str, str]) -> None:
    from app.store.pagination import encode_cursor

    job_id = str(uuid.uuid4())
    # A well-formed cursor whose id is a number, not a string.
    int_id_cursor = base64.urlsafe_b64encode(b'["2026-01-01T00:00:00+00:00", 5]').decode()
    for path, cursor in (
        (f"/v1/jobs/{job_id}/runs", encode_cursor(2**70)),
        ("/v1/jobs", encode_cursor("0001-01-01T00:00:00+14:00", job_id)),
        ("/v1/jobs", encode_cursor("2026-01-01T00:00:00", job_id)),
        ("/v1/jobs", int_id_cursor),
        ("/v1/targets", int_id_cursor),
        ("/v1/dead-letters", "bm90IGpzb24"),
    ):
        response = await client.get(path, params={"cursor": cursor}, headers=auth)
        assert response.status_code == 400, (path, response.text)
        assert response.json()["errors"][0]["field"] == "cursor"


async def test_malformed_json_is_400(client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine) -> None:
    response = await client.post(
        "/v1/jobs", content=b'{"target_id": ', headers={**auth, "content-type": "application/json"}
    )
    assert response.status_code == 400
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["errors"][0]["field"] == "body"
    assert await job_count(engine) == 0


async def test_missing_or_wrong_key_is_401(client: httpx.AsyncClient, auth: dict[str, str]) -> None:
    for headers in ({}, {"Authorization": "Bearer chk_wrong"}, {"Authorization": "Basic Zm9vOmJhcg=="}):
        response = await client.get("/v1/jobs", headers=headers)
        assert response.status_code == 401, headers
        assert response.headers["content-type"] == "application/problem+json"
        assert "chk_wrong" not in response.text
    assert (await client.get("/v1/jobs", headers=auth)).status_code == 200


async def test_tenants_never_see_each_others_jobs(
    client: httpx.AsyncClient, auth: dict[str, str], target: dict[str, Any], engine: AsyncEngine
) -> None:
    job = await make_job(client, auth, target["id"], delay_s=60)
    other = await new_tenant(engine)
    assert (await client.get(f"/v1/jobs/{job['id']}", headers=other)).status_code == 404
    assert (await client.get(f"/v1/jobs/{job['id']}/runs", headers=other)).status_code == 404
    assert (await client.post(f"/v1/jobs/{job['id']}/cancel", headers=other)).status_code == 404
    assert (await client.get("/v1/jobs", headers=other)).json()["items"] == []
    assert (await client.get(f"/v1/targets/{target['id']}", headers=other)).status_code == 404
    assert (await client.get("/v1/dead-letters", headers=other)).json()["items"] == []
    # And the owner still sees it, unchanged.
    assert (await client.get(f"/v1/jobs/{job['id']}", headers=auth)).json()["state"] == "scheduled"


async def test_list_filters_and_paginates_without_gaps_or_repeats(
    client: httpx.AsyncClient, auth: dict[str, str], target: dict[str, Any]
) -> None:
    second_target = await make_target(client, auth, "http://127.0.0.1:9/other")
    created = [await make_job(client, auth, target["id"], delay_s=60) for _ in range(7)]
    await make_job(client, auth, second_target["id"], delay_s=60)
    cancelled = created[0]
    await client.post(f"/v1/jobs/{cancelled['id']}/cancel", headers=auth)

    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 3, "target_id": target["id"]}
        if cursor:
            params["cursor"] = cursor
        page = (await client.get("/v1/jobs", params=params, headers=auth)).json()
        seen += [j["id"] for j in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(j["id"] for j in created)
    assert len(seen) == len(set(seen))

    only_cancelled = (await client.get("/v1/jobs", params={"state": "cancelled"}, headers=auth)).json()["items"]
    assert [j["id"] for j in only_cancelled] == [cancelled["id"]]
    bad = await client.get("/v1/jobs", params={"state": "sleeping"}, headers=auth)
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "state"
    bad_cursor = await client.get("/v1/jobs", params={"cursor": "garbage!"}, headers=auth)
    assert bad_cursor.status_code == 400 and bad_cursor.json()["errors"][0]["field"] == "cursor"


async def test_cancel_then_cancel_again_conflicts(
    client: httpx.AsyncClient, auth: dict[str, str], target: dict[str, Any]
) -> None:
    job = await make_job(client, auth, target["id"], every_s=60)
    response = await client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth)
    assert response.status_code == 200
    body = response.json()
    assert body["state"] == "cancelled" and body["next_run_at"] is None and body["finished_at"]
    again = await client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth)
    assert again.status_code == 409 and again.json()["state"] == "cancelled"
    assert (await client.post(f"/v1/jobs/{uuid.uuid4()}/cancel", headers=auth)).status_code == 404


async def test_payload_round_trips_any_json_object(
    client: httpx.AsyncClient, auth: dict[str, str], target: dict[str, Any]
) -> None:
    for payload in ({"list": [1, "two", None, {"deep": [True]}]}, {"s": "just a string", "n": 42}, {}, None):
        job = await make_job(client, auth, target["id"], delay_s=60, payload=payload)
        assert job["payload"] == payload
    # The contract types payload as a JSON object (generated clients rely on it).
    for not_an_object in ([1, 2], "just a string", 42):
        response = await client.post(
            "/v1/jobs", json={"target_id": target["id"], "delay_s": 60, "payload": not_an_object}, headers=auth
        )
        assert response.status_code == 422 and response.json()["errors"][0]["field"] == "payload"


@pytest.mark.date_sensitive
async def test_schedule_preview_shows_fire_times_with_offsets_across_dst(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine
) -> None:
    response = await client.get(
        "/v1/schedules/preview",
        params={"cron": "@daily", "timezone": "Europe/Berlin", "count": 400},
        headers=auth,
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["cron"] == "0 0 * * *" and body["timezone"] == "Europe/Berlin"
    fires = body["fire_times"]
    assert len(fires) == 400
    # A year of midnights in Berlin spans both offsets; each local time is midnight.
    assert {f["utc_offset"] for f in fires} == {"+01:00", "+02:00"}
    berlin = __import__("zoneinfo").ZoneInfo("Europe/Berlin")
    async with engine.connect() as conn:
        now = await conn.scalar(select(func.now()))
    assert now is not None and now < dt.datetime.fromisoformat(fires[0]["utc"]) <= now + dt.timedelta(days=1)
    for fire in fires:
        local = dt.datetime.fromisoformat(fire["at"])
        assert (local.hour, local.minute) == (0, 0)
        assert local == dt.datetime.fromisoformat(fire["utc"])
        # The offset is the one the zone has at that instant (whichever side of a change).
        assert local.utcoffset() == local.astimezone(berlin).utcoffset()
    assert await job_count(engine) == 0  # a preview creates nothing

    refused: list[tuple[dict[str, str | int], str]] = [
        ({"cron": "0 0 30 2 *"}, "cron"),
        ({"cron": "* * * * *", "timezone": "Mars/Base"}, "timezone"),
        ({"cron": "* * * * *", "count": 0}, "count"),
        ({}, "cron"),
    ]
    for params, field in refused:
        bad = await client.get("/v1/schedules/preview", params=params, headers=auth)
        assert bad.status_code == 422, (params, bad.text)
        assert bad.json()["errors"][0]["field"] == field
    assert (await client.get("/v1/schedules/preview", params={"cron": "* * * * *"})).status_code == 401
