"""Pause, resume, trigger and PATCH through the API, on a real PostgreSQL."""

from __future__ import annotations

import datetime as dt
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import pytest
from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store.claims import job_claim_due
from app.store.tables import jobs
from tests.conftest import TEST_KEY_RING, make_job, make_target
from tests.problems import assert_problem


async def post(client: httpx.AsyncClient, auth: dict[str, str], path: str, **kwargs: Any) -> httpx.Response:
    return await client.post(path, headers=auth, **kwargs)


async def claim_all(engine: AsyncEngine) -> list[str]:
    async with engine.begin() as conn:
        return [str(job.id) for job in await job_claim_due(conn, TEST_KEY_RING, "r", 100, 30)]


def ts(value: str) -> dt.datetime:
    return dt.datetime.fromisoformat(value)


async def test_a_paused_job_is_never_claimed_and_resume_keeps_its_occurrence(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine
) -> None:
    target = await make_target(client, auth, "http://127.0.0.1:9/hook")
    job = await make_job(client, auth, target["id"], every_s=3600)
    paused = await post(client, auth, f"/v1/jobs/{job['id']}/pause")
    assert paused.status_code == 200
    assert paused.json()["state"] == "paused" and paused.json()["next_run_at"] is None
    # Even once its fire time has passed, nothing claims a paused job.
    async with engine.begin() as conn:
        await conn.execute(update(jobs).values(scheduled_for=func.now() - dt.timedelta(minutes=5)))
    assert await claim_all(engine) == []

    resumed = (await post(client, auth, f"/v1/jobs/{job['id']}/resume")).json()
    assert resumed["state"] == "scheduled"
    # Due at once: the occurrence missed while paused is settled by the misfire policy.
    assert resumed["next_run_at"] == resumed["scheduled_for"]
    assert await claim_all(engine) == [job["id"]]


async def test_pause_and_resume_refuse_jobs_in_the_wrong_state(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine
) -> None:
    target = await make_target(client, auth, "http://127.0.0.1:9/hook")
    job = await make_job(client, auth, target["id"], every_s=60)
    not_paused = await post(client, auth, f"/v1/jobs/{job['id']}/resume")
    assert not_paused.status_code == 409 and not_paused.json()["state"] == "scheduled"

    async with engine.begin() as conn:
        await conn.execute(update(jobs).values(run_at=func.now() - dt.timedelta(seconds=1)))
    assert await claim_all(engine) == [job["id"]]
    running = await post(client, auth, f"/v1/jobs/{job['id']}/pause")
    assert running.status_code == 409 and running.headers["content-type"] == "application/problem+json"
    assert running.json()["state"] == "running"

    other = await make_job(client, auth, target["id"], delay_s=60)
    await post(client, auth, f"/v1/jobs/{other['id']}/cancel")
    finished = await post(client, auth, f"/v1/jobs/{other['id']}/pause")
    assert finished.status_code == 409 and finished.json()["state"] == "cancelled"
    assert (await post(client, auth, "/v1/jobs/00000000-0000-4000-8000-000000000000/pause")).status_code == 404


async def test_trigger_runs_one_extra_occurrence_now_without_shifting_the_schedule(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine
) -> None:
    target = await make_target(client, auth, "http://127.0.0.1:9/hook")
    job = await make_job(client, auth, target["id"], cron="0 9 * * *", timezone="Europe/Berlin", payload={"k": 1})
    response = await post(client, auth, f"/v1/jobs/{job['id']}/trigger")
    assert response.status_code == 201
    extra = response.json()
    assert extra["id"] != job["id"] and extra["schedule_kind"] == "once" and extra["parent_job_id"] == job["id"]
    assert extra["payload"] == {"k": 1} and extra["target_id"] == target["id"]
    assert extra["max_attempts"] == job["max_attempts"]
    assert await claim_all(engine) == [extra["id"]]  # due now; the cron job is not
    after = (await client.get(f"/v1/jobs/{job['id']}", headers=auth)).json()
    assert after["next_run_at"] == job["next_run_at"] and after["state"] == "scheduled"


@pytest.mark.date_sensitive
async def test_patch_changes_fields_and_recomputes_the_next_fire_time(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine
) -> None:
    target = await make_target(client, auth, "http://127.0.0.1:9/hook")
    other = await make_target(client, auth, "http://127.0.0.1:9/other")
    job = await make_job(client, auth, target["id"], every_s=3600, priority=1)
    async with engine.connect() as conn:
        now = await conn.scalar(select(func.now()))
    assert now is not None
    response = await client.patch(
        f"/v1/jobs/{job['id']}",
        json={
            "cron": "30 6 * * *",
            "timezone": "America/New_York",
            "payload": None,
            "priority": 7,
            "target_id": other["id"],
            "max_attempts": 9,
        },
        headers=auth,
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["schedule_kind"], body["cron"], body["timezone"], body["every_s"]) == (
        "cron",
        "30 6 * * *",
        "America/New_York",
        None,
    )
    assert body["payload"] is None and body["priority"] == 7 and body["target_id"] == other["id"]
    assert body["max_attempts"] == 9
    # 06:30 on New York's wall clock (EST or EDT, whichever holds that day), the first after now.
    next_run = ts(body["next_run_at"])
    local = next_run.astimezone(ZoneInfo("America/New_York"))
    assert (local.hour, local.minute, local.second) == (6, 30, 0)
    assert now < next_run <= now + dt.timedelta(days=1, hours=1)
    assert body["scheduled_for"] == body["next_run_at"]

    # A new time zone alone keeps the expression.
    moved = (await client.patch(f"/v1/jobs/{job['id']}", json={"timezone": "Asia/Tokyo"}, headers=auth)).json()
    assert moved["cron"] == "30 6 * * *" and moved["timezone"] == "Asia/Tokyo"
    tokyo = ts(moved["next_run_at"]).astimezone(ZoneInfo("Asia/Tokyo"))
    assert (tokyo.hour, tokyo.minute) == (6, 30)


async def test_patch_refuses_bad_changes_and_writes_nothing(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine
) -> None:
    target = await make_target(client, auth, "http://127.0.0.1:9/hook")
    job = await make_job(client, auth, target["id"], every_s=60, max_attempts=3)
    before = (await client.get(f"/v1/jobs/{job['id']}", headers=auth)).json()
    for change, field in (
        ({"target_id": "00000000-0000-4000-8000-000000000000"}, "target_id"),
        ({"cron": "0 0 30 2 *"}, "cron"),
        ({"every_s": 60, "cron": "* * * * *"}, "every_s"),  # two schedules: the detail names both
        ({"backoff_base_s": 100, "backoff_max_s": 10}, "backoff_max_s"),
        ({"priority": 10}, "priority"),
        ({"bogus": 1}, "bogus"),
    ):
        response = await client.patch(f"/v1/jobs/{job['id']}", json={**change, "payload": {"x": 1}}, headers=auth)
        assert_problem(response, 422, field)
    assert (await client.get(f"/v1/jobs/{job['id']}", headers=auth)).json() == before

    # Attempts already made bound max_attempts from below; a running job cannot change.
    async with engine.begin() as conn:
        await conn.execute(update(jobs).values(run_at=func.now() - dt.timedelta(seconds=1)))
    assert await claim_all(engine) == [job["id"]]
    busy = await client.patch(f"/v1/jobs/{job['id']}", json={"priority": 2}, headers=auth)
    assert busy.status_code == 409 and busy.json()["state"] == "running"
    async with engine.begin() as conn:
        await conn.execute(
            update(jobs).values(
                state="retrying",
                attempt=2,
                run_at=func.now(),
                lease_owner=None,
                lease_token=None,
                lease_expires_at=None,
            )
        )
    too_low = await client.patch(f"/v1/jobs/{job['id']}", json={"max_attempts": 1}, headers=auth)
    assert_problem(too_low, 422, "max_attempts")


async def test_a_new_schedule_for_a_paused_job_waits_for_resume(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine
) -> None:
    target = await make_target(client, auth, "http://127.0.0.1:9/hook")
    job = await make_job(client, auth, target["id"], every_s=60)
    await post(client, auth, f"/v1/jobs/{job['id']}/pause")
    patched = (await client.patch(f"/v1/jobs/{job['id']}", json={"delay_s": 0.001}, headers=auth)).json()
    assert patched["state"] == "paused" and patched["next_run_at"] is None
    assert await claim_all(engine) == []
    resumed = (await post(client, auth, f"/v1/jobs/{job['id']}/resume")).json()
    assert resumed["schedule_kind"] == "once" and resumed["next_run_at"] == patched["scheduled_for"]
    async with engine.connect() as conn:
        assert await conn.scalar(select(func.count()).select_from(jobs)) == 1
    assert await claim_all(engine) == [job["id"]]
