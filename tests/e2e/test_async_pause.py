"""Pausing a job whose async attempt is open (app/store/completions.py): the pause waits for
the attempt instead of interrupting it or answering 409 for as long as it runs."""

from __future__ import annotations

import datetime as dt
from urllib.parse import urlsplit

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from app.services.reaper import Reaper, ReaperConfig
from app.services.scheduler import Scheduler
from tests.conftest import TEST_KEY_RING, make_job, make_target
from tests.e2e.test_delivery import drive, get_job
from tests.receiver import Receiver, Reply


async def _open_recurring(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler, **target: object
) -> tuple[str, str]:
    receiver.default = Reply(status=202, body=b"")
    created = await make_target(client, auth, receiver.url(), completion="async", **target)
    # Recurring, first due in a second (a fire time is never in the past).
    start_at = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)).isoformat()
    job = await make_job(client, auth, created["id"], every_s=3600, start_at=start_at)

    async def opened() -> bool:
        return bool((await get_job(client, auth, job["id"]))["awaiting_completion"])

    await drive(scheduler, opened, message="the 202 leaves the attempt open")
    return job["id"], urlsplit(receiver.requests[-1].headers["cronhook-completion-url"]).path


async def test_a_pause_during_an_open_attempt_takes_effect_when_it_is_reported(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler
) -> None:
    job_id, path = await _open_recurring(client, auth, receiver, scheduler)
    paused = await client.post(f"/v1/jobs/{job_id}/pause", headers=auth)
    assert paused.status_code == 200, paused.text
    assert paused.json()["state"] == "running" and paused.json()["pause_requested"] is True
    # The attempt goes on: its receiver still reports on it.
    assert (await client.post(f"{path}/heartbeat", json={"progress": 50})).status_code == 204
    assert (await client.post(path, json={"outcome": "succeeded"})).status_code == 204
    job = await get_job(client, auth, job_id)
    assert job["state"] == "paused" and job["pause_requested"] is False and job["runs"] == 1
    resumed = await client.post(f"/v1/jobs/{job_id}/resume", headers=auth)
    assert resumed.status_code == 200 and resumed.json()["state"] == "scheduled"


async def test_a_resume_before_the_attempt_ends_withdraws_the_pause(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler
) -> None:
    job_id, path = await _open_recurring(client, auth, receiver, scheduler)
    assert (await client.post(f"/v1/jobs/{job_id}/pause", headers=auth)).json()["pause_requested"] is True
    resumed = await client.post(f"/v1/jobs/{job_id}/resume", headers=auth)
    assert resumed.status_code == 200 and resumed.json()["pause_requested"] is False
    assert (await client.post(path, json={"outcome": "succeeded"})).status_code == 204
    assert (await get_job(client, auth, job_id))["state"] == "scheduled"


async def test_a_pause_pending_on_a_timed_out_attempt_pauses_its_retry(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler, engine: AsyncEngine
) -> None:
    job_id, path = await _open_recurring(client, auth, receiver, scheduler, heartbeat_timeout_s=1)
    assert (await client.post(f"/v1/jobs/{job_id}/pause", headers=auth)).status_code == 200
    reaper = Reaper(engine, ReaperConfig(), TEST_KEY_RING)

    async def reaped() -> bool:
        await reaper.run_once()
        state: str = (await get_job(client, auth, job_id))["state"]
        return state != "running"

    await drive(scheduler, reaped, timeout=30, message="the reaper fails the silent attempt")
    job = await get_job(client, auth, job_id)
    # The retry waits, paused, instead of being delivered; the old token is fenced.
    assert job["state"] == "paused" and job["attempt"] == 1 and not job["pause_requested"]
    assert (await client.post(path, json={"outcome": "succeeded"})).status_code == 410
    assert len(receiver.requests) == 1


async def test_pausing_a_job_with_no_open_attempt_while_it_runs_is_still_a_conflict(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler
) -> None:
    target = await make_target(client, auth, receiver.url())
    job = await make_job(client, auth, target["id"])
    await drive(scheduler, lambda: receiver.requests, message="delivered")
    paused = await client.post(f"/v1/jobs/{job['id']}/pause", headers=auth)
    # A finished one-off: 409, and nothing pending.
    assert paused.status_code == 409
    assert (await get_job(client, auth, job["id"]))["pause_requested"] is False
