"""Precise wake-ups: a scheduler that has nothing due sleeps up to its poll interval, yet a
job created (or resumed) due now is delivered without waiting for the next poll, because
the jobs trigger NOTIFYs the scheduler's listener (migration 0007); and a job due before the
next poll is claimed at its due time, learnt from the previous claim."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
from collections.abc import AsyncIterator

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.services.due_listener import DueListener
from app.services.scheduler import Scheduler
from app.services.scheduler_config import SchedulerConfig
from app.settings import Settings
from tests.conftest import TEST_KEY_RING, make_job, make_target
from tests.receiver import Receiver, wait_for

# Longer than any wait below: a delivery within a test's deadline came from a wake-up, not a poll.
LONG_POLL_S = 60.0


@pytest.fixture
async def sleepy_scheduler(engine: AsyncEngine, settings: Settings) -> AsyncIterator[Scheduler]:
    """A scheduler running its loop (run_forever) with a one-minute poll interval."""
    config = dataclasses.replace(SchedulerConfig.from_settings(settings), poll_interval_s=LONG_POLL_S)
    scheduler = Scheduler(engine, config, TEST_KEY_RING)
    stop = asyncio.Event()
    task = asyncio.create_task(scheduler.run_forever(stop))
    try:
        await wait_for(lambda: scheduler.ownership.held(), timeout=15, message="partitions owned")
        yield scheduler
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await scheduler.close(grace_s=5)


async def test_a_job_created_due_now_is_delivered_before_the_next_poll(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, sleepy_scheduler: Scheduler
) -> None:
    target = await make_target(client, auth, receiver.url())
    # Let the scheduler finish its first (empty) claim and go to sleep for a minute.
    await asyncio.sleep(0.5)
    await make_job(client, auth, target["id"])  # due at once
    await wait_for(lambda: len(receiver.requests) == 1, timeout=20, message="delivery woken by NOTIFY")


async def test_a_job_due_in_a_moment_is_claimed_at_its_due_time_not_at_the_next_poll(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, sleepy_scheduler: Scheduler
) -> None:
    target = await make_target(client, auth, receiver.url())
    job = await make_job(client, auth, target["id"], delay_s=2)
    await wait_for(lambda: len(receiver.requests) == 1, timeout=20, message="delivery at its due time")
    assert receiver.requests[0].headers["cronhook-job-id"] == job["id"]


async def test_a_job_claimed_ahead_of_its_due_time_is_posted_at_it_never_before(
    engine: AsyncEngine, settings: Settings, client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver
) -> None:
    # The longest claim-ahead allowed (1 s, the default is 50 ms): a POST made at the claim
    # rather than at the due time would arrive most of a second early.
    config = dataclasses.replace(
        SchedulerConfig.from_settings(settings), poll_interval_s=LONG_POLL_S, claim_ahead_s=1.0
    )
    scheduler = Scheduler(engine, config, TEST_KEY_RING)
    stop = asyncio.Event()
    task = asyncio.create_task(scheduler.run_forever(stop))
    try:
        await wait_for(lambda: scheduler.ownership.held(), timeout=15, message="partitions owned")
        target = await make_target(client, auth, receiver.url())
        # Due 4 s on: however slow the four creates, none is due before the watch below starts.
        jobs = [await make_job(client, auth, target["id"], delay_s=4.0 + i / 4) for i in range(4)]
        due = {job["id"]: dt.datetime.fromisoformat(job["next_run_at"]).timestamp() for job in jobs}

        async def leased_before_any_post() -> bool:
            state = (await client.get(f"/v1/jobs/{jobs[0]['id']}", headers=auth)).json()["state"]
            return state == "running" and not receiver.requests

        # Claimed (leased) up to a second ahead, while nothing has been POSTed yet.
        deadline = asyncio.get_running_loop().time() + 10
        while not await leased_before_any_post():
            assert asyncio.get_running_loop().time() < deadline, "the first job was never leased ahead of its POST"
            await asyncio.sleep(0.02)
        await wait_for(lambda: len(receiver.requests) == len(jobs), timeout=20, message="all four delivered")
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await scheduler.close(grace_s=5)
    for request in receiver.requests:
        job_id = request.headers["cronhook-job-id"]
        # The database and the receiver share this machine's clock.
        assert request.at >= due[job_id], f"{job_id} POSTed {due[job_id] - request.at:.3f} s before its due time"
        # At its due time, give or take a busy machine: not a claim-ahead's second late either.
        assert request.at - due[job_id] < 2.0


async def test_a_paused_job_resumed_when_due_is_delivered_before_the_next_poll(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, sleepy_scheduler: Scheduler
) -> None:
    target = await make_target(client, auth, receiver.url())
    job = await make_job(client, auth, target["id"], delay_s=1)
    assert (await client.post(f"/v1/jobs/{job['id']}/pause", headers=auth)).status_code == 200
    await asyncio.sleep(1.5)  # due meanwhile, but paused
    assert receiver.requests == []
    assert (await client.post(f"/v1/jobs/{job['id']}/resume", headers=auth)).status_code == 200
    await wait_for(lambda: len(receiver.requests) == 1, timeout=20, message="delivery woken by the resume")


async def test_one_notice_per_statement_only_for_jobs_due_within_a_minute(
    engine: AsyncEngine, client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver
) -> None:
    notices: list[float | None] = []
    stop = asyncio.Event()
    listening = asyncio.create_task(DueListener(engine, notices.append).run(stop))
    try:
        target = await make_target(client, auth, receiver.url())
        await asyncio.sleep(0.5)  # the listener is connected by now
        due_in_an_hour = await make_job(client, auth, target["id"], delay_s=3600)
        due_soon = await make_job(client, auth, target["id"], delay_s=5)
        await wait_for(lambda: len(notices) >= 1, timeout=10, message="a notice")
        await asyncio.sleep(0.5)  # a second notice would have arrived by now
        assert due_in_an_hour["next_run_at"] and len(notices) == 1  # the job due in an hour sent none
        (due_epoch_s,) = notices
        assert due_epoch_s is not None
        assert abs(due_epoch_s - dt.datetime.fromisoformat(due_soon["next_run_at"]).timestamp()) < 0.001
    finally:
        stop.set()
        await asyncio.wait_for(listening, 10)
