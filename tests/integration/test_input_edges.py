"""Inputs at the edges that a fuzzing review found mishandled: each is a clear 4xx naming the
field, or does what a user means, and none of them can stop the scheduler."""

from __future__ import annotations

import datetime as dt
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import pytest
from sqlalchemy import select, text, update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.services.scheduler import Scheduler
from app.services.scheduler_config import SchedulerConfig
from app.settings import Settings
from app.store.claims import job_claim_due
from app.store.tables import jobs
from tests.conftest import TEST_KEY_RING, make_job, make_target
from tests.problems import row_counts
from tests.receiver import wait_for


async def problem(response: httpx.Response, status: int, field: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = response.json()
    assert [e["field"] for e in body["errors"]] == [field], body
    return body


async def count_jobs(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return len((await conn.execute(select(jobs.c.id))).all())


@pytest.mark.parametrize(
    ("field", "value"),
    [
        # PostgreSQL would store these as -infinity / infinity, which no datetime can read back.
        ("start_at", "0001-01-01T00:00:00Z"),
        ("end_at", "9999-12-31T23:59:59.999999Z"),
        # In range as written, out of datetime's range once converted to UTC.
        ("start_at", "0001-01-01T00:00:00+01:00"),
        ("end_at", "9999-12-31T23:59:59-14:00"),
        ("start_at", "1999-12-31T23:59:59Z"),
    ],
)
async def test_bounds_outside_the_supported_range_are_422(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine, field: str, value: str
) -> None:
    target = await make_target(client, auth, "http://127.0.0.1:9/hook")
    before = await count_jobs(engine)
    for schedule in ({"every_s": 60}, {"cron": "0 9 * * *", "timezone": "Europe/Berlin"}):
        body = {"target_id": target["id"], "payload": {}, **schedule, field: value}
        await problem(await client.post("/v1/jobs", json=body, headers=auth), 422, field)
    assert await count_jobs(engine) == before
    job = await make_job(client, auth, target["id"], every_s=60)
    await problem(await client.patch(f"/v1/jobs/{job['id']}", json={field: value}, headers=auth), 422, field)


async def test_an_end_at_decades_ahead_is_accepted(client: httpx.AsyncClient, auth: dict[str, str]) -> None:
    target = await make_target(client, auth, "http://127.0.0.1:9/hook")
    job = await make_job(client, auth, target["id"], every_s=60, end_at="2090-01-01T00:00:00Z")
    assert job["end_at"] == "2090-01-01T00:00:00Z"


async def test_max_attempts_cannot_drop_to_the_attempts_made_while_a_retry_is_pending(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine
) -> None:
    target = await make_target(client, auth, "http://127.0.0.1:9/hook")
    job = await make_job(client, auth, target["id"], delay_s=3600, max_attempts=5)
    async with engine.begin() as conn:  # one failed attempt made, a retry pending
        await conn.execute(update(jobs).where(jobs.c.id == job["id"]).values(state="retrying", attempt=1))
    body = await problem(
        await client.patch(f"/v1/jobs/{job['id']}", json={"max_attempts": 1}, headers=auth), 422, "max_attempts"
    )
    assert "retry is pending" in body["detail"]
    assert (await client.get(f"/v1/jobs/{job['id']}", headers=auth)).json()["max_attempts"] == 5
    ok = await client.patch(f"/v1/jobs/{job['id']}", json={"max_attempts": 2}, headers=auth)
    assert ok.status_code == 200 and ok.json()["max_attempts"] == 2
    # The pending retry is claimable without breaking attempt <= max_attempts.
    async with engine.begin() as conn:
        await conn.execute(update(jobs).where(jobs.c.id == job["id"]).values(run_at=text("now()")))
        (claimed,) = await job_claim_due(conn, TEST_KEY_RING, "r", 10, 30)
    assert claimed.attempt == 2
    # A new schedule starts a fresh occurrence: any max_attempts of 1 or more is fine then.
    other = await make_job(client, auth, target["id"], delay_s=3600, max_attempts=5)
    async with engine.begin() as conn:
        await conn.execute(update(jobs).where(jobs.c.id == other["id"]).values(state="retrying", attempt=2))
    fresh = await client.patch(f"/v1/jobs/{other['id']}", json={"max_attempts": 1, "delay_s": 60}, headers=auth)
    assert fresh.status_code == 200 and fresh.json()["attempt"] == 0


@pytest.mark.date_sensitive
async def test_patching_a_cron_expression_keeps_the_jobs_time_zone(
    client: httpx.AsyncClient, auth: dict[str, str]
) -> None:
    target = await make_target(client, auth, "http://127.0.0.1:9/hook")
    job = await make_job(client, auth, target["id"], cron="0 9 * * *", timezone="Europe/Berlin")
    patched = (await client.patch(f"/v1/jobs/{job['id']}", json={"cron": "30 7 * * *"}, headers=auth)).json()
    assert patched["timezone"] == "Europe/Berlin"
    # 07:30 on Berlin's wall clock, whichever offset (CET or CEST) holds on that day.
    local = dt.datetime.fromisoformat(patched["next_run_at"]).astimezone(ZoneInfo("Europe/Berlin"))
    assert (local.hour, local.minute) == (7, 30)
    # ...unless the PATCH names a zone.
    rezoned = await client.patch(f"/v1/jobs/{job['id']}", json={"cron": "30 7 * * *", "timezone": "UTC"}, headers=auth)
    assert rezoned.json()["timezone"] == "UTC"


async def test_a_bound_patched_to_null_is_removed(client: httpx.AsyncClient, auth: dict[str, str]) -> None:
    target = await make_target(client, auth, "http://127.0.0.1:9/hook")
    job = await make_job(client, auth, target["id"], every_s=60, max_runs=3, end_at="2090-01-01T00:00:00Z")
    patched = await client.patch(f"/v1/jobs/{job['id']}", json={"max_runs": None, "end_at": None}, headers=auth)
    assert patched.status_code == 200
    assert (patched.json()["max_runs"], patched.json()["end_at"]) == (None, None)
    # A field not sent stays as it was.
    kept = await client.patch(f"/v1/jobs/{job['id']}", json={"max_runs": 4}, headers=auth)
    assert kept.json()["max_runs"] == 4
    again = await client.patch(f"/v1/jobs/{job['id']}", json={"priority": 3}, headers=auth)
    assert again.json()["max_runs"] == 4


@pytest.mark.parametrize(
    "body",
    [
        b'{"target_id": "x", "payload": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        b'{"target_id": "x", "every_s": 60, "payload": ' + b"9" * 5000 + b"}",
    ],
    ids=["nested-too-deep", "integer-too-long"],
)
async def test_json_the_parser_gives_up_on_is_a_400_naming_the_body(
    client: httpx.AsyncClient, auth: dict[str, str], body: bytes
) -> None:
    headers = {**auth, "content-type": "application/json"}
    await problem(await client.post("/v1/jobs", content=body, headers=headers), 400, "body")


@pytest.mark.parametrize("zone", ["right/Europe/Berlin", "posix/Europe/Berlin", "posixrules", "Factory", "localtime"])
async def test_non_canonical_time_zone_files_are_not_zones(
    client: httpx.AsyncClient, auth: dict[str, str], zone: str
) -> None:
    target = await make_target(client, auth, "http://127.0.0.1:9/hook")
    body = {"target_id": target["id"], "payload": {}, "cron": "0 9 * * *", "timezone": zone}
    await problem(await client.post("/v1/jobs", json=body, headers=auth), 422, "timezone")
    preview = await client.get("/v1/schedules/preview", params={"cron": "0 9 * * *", "timezone": zone}, headers=auth)
    await problem(preview, 422, "timezone")


async def test_rates_too_small_to_compute_are_422(client: httpx.AsyncClient, auth: dict[str, str]) -> None:
    body = {"name": "t", "url": "http://127.0.0.1:9/hook", "rate_per_s": 5e-324}
    await problem(await client.post("/v1/targets", json=body, headers=auth), 422, "rate_per_s")
    replay = await client.post("/v1/dead-letters/replay", json={"rate_per_s": 1e-9}, headers=auth)
    await problem(replay, 422, "rate_per_s")


async def test_a_row_the_scheduler_cannot_load_is_paused_and_the_rest_are_delivered(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine
) -> None:
    target = await make_target(client, auth, "http://127.0.0.1:9/hook")
    broken = await make_job(client, auth, target["id"], every_s=60)
    legacy = await make_job(client, auth, target["id"], every_s=60)
    healthy = await make_job(client, auth, target["id"])
    async with engine.begin() as conn:
        # Data written before validation existed, or by hand: bounds no datetime can hold.
        # An open-ended one (-infinity start, infinity end) simply means no bound...
        await conn.execute(
            update(jobs)
            .where(jobs.c.id == legacy["id"])
            .values(start_at=text("'-infinity'::timestamptz"), end_at=text("'infinity'::timestamptz"))
        )
        # ...but a start at +infinity cannot be scheduled at all.
        await conn.execute(
            update(jobs).where(jobs.c.id == broken["id"]).values(start_at=text("'infinity'::timestamptz"))
        )
        await conn.execute(update(jobs).where(jobs.c.id.in_([broken["id"], legacy["id"]])).values(run_at=text("now()")))
    async with engine.begin() as conn:
        claimed = await job_claim_due(conn, TEST_KEY_RING, "r", 10, 30)
    assert sorted(str(job.id) for job in claimed) == sorted([healthy["id"], legacy["id"]])
    (loaded,) = [job for job in claimed if str(job.id) == legacy["id"]]
    assert loaded.recurrence is not None and (loaded.recurrence.bounds.start_at, loaded.recurrence.bounds.end_at) == (
        None,
        None,
    )
    after = (await client.get(f"/v1/jobs/{broken['id']}", headers=auth)).json()
    assert after["state"] == "paused" and after["attempt"] == 0
    assert "could not load this job" in after["last_error"]
    # Nothing is lost silently: it waits, visible, for the user to cancel (or fix) it.
    cancelled = await client.post(f"/v1/jobs/{broken['id']}/cancel", headers=auth)
    assert cancelled.json()["state"] == "cancelled"


@pytest.mark.parametrize(
    ("fields", "patch", "field"),
    [
        ({"every_s": 60}, {"timezone": "Asia/Tokyo"}, "timezone"),
        ({"delay_s": 60}, {"timezone": "Asia/Tokyo"}, "timezone"),
        ({"cron": "0 9 * * *"}, {"cron": None}, "cron"),
        ({"cron": "0 9 * * *"}, {"timezone": None}, "timezone"),
        ({"every_s": 60}, {"every_s": None}, "every_s"),
        ({"delay_s": 60}, {"backoff_base_s": 700}, "backoff_base_s"),
        ({"delay_s": 60}, {"backoff_base_s": 10, "backoff_max_s": 5}, "backoff_max_s"),
    ],
)
async def test_a_bad_patch_names_the_field_that_was_sent(
    client: httpx.AsyncClient,
    auth: dict[str, str],
    fields: dict[str, Any],
    patch: dict[str, Any],
    field: str,
) -> None:
    target = await make_target(client, auth, "http://127.0.0.1:9/hook")
    job = await make_job(client, auth, target["id"], **fields)
    await problem(await client.patch(f"/v1/jobs/{job['id']}", json=patch, headers=auth), 422, field)
    assert (await client.get(f"/v1/jobs/{job['id']}", headers=auth)).json() == job


async def dead_letter_count(client: httpx.AsyncClient, auth: dict[str, str]) -> int:
    return len((await client.get("/v1/dead-letters", headers=auth)).json()["items"])


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/jobs", {"every_s": True}, "every_s"),
        ("/v1/jobs", {"delay_s": "5"}, "delay_s"),
        ("/v1/jobs", {"delay_s": 5, "priority": "5"}, "priority"),
        ("/v1/jobs", {"delay_s": 5, "max_attempts": True}, "max_attempts"),
        ("/v1/targets", {"name": "t", "url": "http://127.0.0.1:9/h", "max_in_flight": True}, "max_in_flight"),
        ("/v1/targets", {"name": "t", "url": "http://127.0.0.1:9/h", "retry_on_status": ["404"]}, "retry_on_status[0]"),
        ("/v1/dead-letters/replay", {"include_replayed": "yes"}, "include_replayed"),
    ],
)
async def test_numbers_and_booleans_must_be_json_numbers_and_booleans(
    client: httpx.AsyncClient,
    auth: dict[str, str],
    engine: AsyncEngine,
    settings: Settings,
    path: str,
    body: dict[str, Any],
    field: str,
) -> None:
    target = await make_target(client, auth, "http://127.0.0.1:9/hook")
    if path == "/v1/jobs":
        body = {"target_id": target["id"], "payload": {}, **body}
    if path == "/v1/dead-letters/replay":
        # A dead letter a valid replay would turn into a job.
        await make_job(client, auth, target["id"], max_attempts=1)
        scheduler = Scheduler(engine, SchedulerConfig.from_settings(settings), TEST_KEY_RING)

        async def dead_lettered() -> bool:
            await scheduler.run_once()
            return await dead_letter_count(client, auth) == 1

        try:
            await wait_for(dead_lettered, message="a dead letter")
        finally:
            await scheduler.close(grace_s=5)
    before = await row_counts(engine)
    response = await problem(await client.post(path, json=body, headers=auth), 422, field)
    assert field in response["detail"]
    # Nothing written: no target, job, run, dead letter or idempotency key.
    assert await row_counts(engine) == before


@pytest.mark.parametrize("field", ["run_at", "start_at", "end_at"])
@pytest.mark.parametrize("value", [1767225600, 1767225600.5, "1767225600", True, "2030-01-01"])
async def test_a_date_time_must_be_rfc_3339_text_not_unix_time(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine, field: str, value: Any
) -> None:
    """The schema says a date-time string; lax parsing would have taken a number as Unix time."""
    target = await make_target(client, auth, "http://127.0.0.1:9/hook")
    schedule = {"run_at": value} if field == "run_at" else {"every_s": 60, field: value}
    before = await row_counts(engine)
    response = await client.post("/v1/jobs", json={"target_id": target["id"], "payload": {}, **schedule}, headers=auth)
    await problem(response, 422, field)
    assert await row_counts(engine) == before
    batch = await client.post(
        "/v1/jobs/batch", json={"jobs": [{"target_id": target["id"], "payload": {}, **schedule}]}, headers=auth
    )
    await problem(batch, 422, f"jobs[0].{field}")
