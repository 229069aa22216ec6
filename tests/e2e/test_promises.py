"""README promises that had no test, end to end through the API, the scheduler and a real
receiver: timeouts and connection errors are retried (also when a target's retry_on_status
replaces the default statuses); overlap_policy allow with the schedule cancelled or paused
while its children finish, and the children's dead letters; max_in_flight freed when the
reaper takes a lease back; dedup_key freed once its job succeeded or died."""

from __future__ import annotations

import datetime as dt
from typing import Any

import httpx
import pytest
from aiohttp import web
from sqlalchemy.ext.asyncio import AsyncEngine

from app.services.reaper import Reaper, ReaperConfig
from app.services.scheduler import Scheduler
from app.store.claims import job_claim_due
from app.store.jobs import db_now
from tests.conftest import TEST_KEY_RING, make_job, make_target
from tests.e2e.test_delivery import drive, get_job, get_runs
from tests.e2e.test_scheduling_semantics import run_without_waiting
from tests.factories import expire_leases
from tests.ports import free_port
from tests.receiver import Receiver, Reply, wait_for


async def state_is(client: httpx.AsyncClient, auth: dict[str, str], job_id: str, *states: str) -> bool:
    return (await get_job(client, auth, job_id))["state"] in states


@pytest.mark.parametrize("retry_on_status", [None, [404]], ids=["default-statuses", "overridden-statuses"])
async def test_a_timeout_is_retried_whatever_statuses_the_target_retries(
    client: httpx.AsyncClient,
    auth: dict[str, str],
    receiver: Receiver,
    scheduler: Scheduler,
    retry_on_status: list[int] | None,
) -> None:
    timeout_s = 1.0
    receiver.script = [Reply(delay_s=timeout_s * 3)]  # answered too late: a timeout
    target = await make_target(client, auth, receiver.url(), timeout_s=timeout_s, retry_on_status=retry_on_status)
    job = await make_job(client, auth, target["id"], max_attempts=5, backoff_base_s=0.05, backoff_max_s=0.1)
    await drive(scheduler, lambda: state_is(client, auth, job["id"], "succeeded", "dead"), message="settled")
    runs = await get_runs(client, auth, job["id"])
    # Retried after the timeout until answered in time (busy cores may time out a retry too).
    outcomes = [r["outcome"] for r in runs]
    assert outcomes[-1] == "success" and set(outcomes[:-1]) == {"timeout"}, outcomes
    assert [r["attempt"] for r in runs] == list(range(1, len(runs) + 1))
    assert (await get_job(client, auth, job["id"]))["state"] == "succeeded"
    # The same occurrence, so the receiver can dedupe the repeat.
    assert len(set(receiver.webhook_ids())) == 1 and len(receiver.requests) == len(runs)


@pytest.mark.parametrize("retry_on_status", [None, [404]], ids=["default-statuses", "overridden-statuses"])
async def test_a_connection_error_is_retried_until_the_receiver_is_back(
    client: httpx.AsyncClient, auth: dict[str, str], scheduler: Scheduler, retry_on_status: list[int] | None
) -> None:
    port = free_port()  # nothing listens there yet: connections are refused
    target = await make_target(client, auth, f"http://127.0.0.1:{port}/hook", retry_on_status=retry_on_status)
    # A long backoff cap, so the attempts do not run out while the receiver comes up.
    job = await make_job(client, auth, target["id"], max_attempts=10, backoff_base_s=0.2, backoff_max_s=0.2)

    async def refused_once() -> bool:
        return any(r["outcome"] == "connection_error" for r in await get_runs(client, auth, job["id"]))

    await drive(scheduler, refused_once, message="a refused connection")
    assert (await get_job(client, auth, job["id"]))["state"] == "retrying"
    received: list[str] = []

    async def hook(request: web.Request) -> web.Response:
        received.append(request.headers["webhook-id"])
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        await drive(scheduler, lambda: state_is(client, auth, job["id"], "succeeded", "dead"), message="settled")
    finally:
        await runner.cleanup()
    outcomes = [r["outcome"] for r in await get_runs(client, auth, job["id"])]
    assert outcomes[-1] == "success" and set(outcomes[:-1]) == {"connection_error"}
    assert len(received) == 1


@pytest.mark.parametrize("action", ["cancel", "pause"])
async def test_overlap_allow_children_in_flight_finish_after_the_schedule_is_stopped(
    client: httpx.AsyncClient,
    auth: dict[str, str],
    receiver: Receiver,
    engine: AsyncEngine,
    scheduler: Scheduler,
    action: str,
) -> None:
    receiver.default = Reply(delay_s=1.5)
    target = await make_target(client, auth, receiver.url(), timeout_s=3)
    job = await make_job(client, auth, target["id"], every_s=1, overlap_policy="allow")
    await run_without_waiting(scheduler, lambda: receiver.in_flight.get("/hook", 0) >= 2, 60, "two children in flight")
    responses: list[httpx.Response] = []

    async def stopped_it() -> bool:
        # A pause is refused (409, state running) while the schedule itself is claimed to hand
        # an occurrence off; as the README says, retry when that finishes.
        responses.append(await client.post(f"/v1/jobs/{job['id']}/{action}", headers=auth))
        return responses[-1].status_code != 409 or responses[-1].json()["state"] != "running"

    await wait_for(stopped_it, timeout=30, message=f"{action} accepted")
    stopped = responses[-1]
    assert stopped.status_code == 200 and stopped.json()["state"] == {"cancel": "cancelled", "pause": "paused"}[action]

    async def children() -> list[dict[str, Any]]:
        params = {"parent_job_id": job["id"], "limit": 200}
        items: list[dict[str, Any]] = (await client.get("/v1/jobs", params=params, headers=auth)).json()["items"]
        return items

    started = await children()
    assert len(started) >= 2

    async def all_finished() -> bool:
        return all(c["state"] == "succeeded" for c in await children())

    # The children already started finish (their POSTs were answered and recorded)...
    await run_without_waiting(scheduler, all_finished, 60, "the children finished")
    # ...and no new occurrence starts while the schedule is stopped, past two more fire times
    # (scheduler passes until the database's clock says so).
    fire_times = len(receiver.requests)
    async with engine.connect() as conn:
        later = await db_now(conn) + dt.timedelta(seconds=2)

    async def two_fire_times_passed() -> bool:
        async with engine.connect() as conn:
            return await db_now(conn) > later

    await run_without_waiting(scheduler, two_fire_times_passed, 60, "two more fire times")
    await drive(scheduler, lambda: True, message="one more pass, deliveries awaited")
    more = await children()
    assert {c["id"] for c in more} == {c["id"] for c in started}
    assert len(receiver.requests) == fire_times == len(started)
    assert (await get_job(client, auth, job["id"]))["state"] == stopped.json()["state"]


async def test_overlap_allow_children_carry_their_own_dead_letters(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler
) -> None:
    receiver.default = Reply(status=500, body=b"down")
    target = await make_target(client, auth, receiver.url(), timeout_s=3)
    job = await make_job(
        client, auth, target["id"], every_s=1, overlap_policy="allow", max_runs=2, max_attempts=2, backoff_base_s=0.05
    )

    async def two_letters() -> bool:
        return len((await client.get("/v1/dead-letters", headers=auth)).json()["items"]) == 2

    await run_without_waiting(scheduler, two_letters, 60, "two dead letters")
    letters = (await client.get("/v1/dead-letters", headers=auth)).json()["items"]
    listed = await client.get("/v1/jobs", params={"parent_job_id": job["id"]}, headers=auth)
    children = {c["id"]: c for c in listed.json()["items"]}
    # Each occurrence's letter belongs to the child that carried it, after its own attempts.
    assert {letter["job_id"] for letter in letters} == set(children) and len(children) == 2
    assert all(letter["attempts"] == 2 and letter["last_status_code"] == 500 for letter in letters)
    assert all(c["state"] == "dead" for c in children.values())
    # The schedule itself is not dead: it ran its two occurrences and ended.
    parent = await get_job(client, auth, job["id"])
    assert (parent["state"], parent["ended_reason"]) == ("succeeded", "max_runs")
    by_job = await client.get("/v1/dead-letters", params={"job_id": next(iter(children))}, headers=auth)
    assert len(by_job.json()["items"]) == 1


async def test_max_in_flight_is_freed_when_the_reaper_takes_a_lease_back(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, engine: AsyncEngine, scheduler: Scheduler
) -> None:
    target = await make_target(client, auth, receiver.url(), max_in_flight=1)
    held = await make_job(client, auth, target["id"], backoff_base_s=0.05, backoff_max_s=0.1)
    async with engine.begin() as conn:
        # A replica claims it and dies: its delivery counts against the limit...
        (claimed,) = await job_claim_due(conn, TEST_KEY_RING, "crashed-replica", 10, 30)
    assert str(claimed.id) == held["id"]
    waiting = await make_job(client, auth, target["id"])
    for _ in range(3):
        await scheduler.run_once()
    assert receiver.requests == [], "a delivery started past max_in_flight"
    assert (await get_job(client, auth, waiting["id"]))["state"] == "scheduled"
    # ...until its lease expires and the reaper takes it back: then both are delivered.
    await expire_leases(engine)
    assert (await Reaper(engine, ReaperConfig(), TEST_KEY_RING).run_once()).rescued == 1

    async def both_succeeded() -> bool:
        return all([await state_is(client, auth, j["id"], "succeeded") for j in (held, waiting)])

    await drive(scheduler, both_succeeded, message="both delivered")
    assert receiver.max_in_flight["/hook"] == 1 and len(receiver.requests) == 2


@pytest.mark.parametrize(("reply", "final"), [(Reply(status=200), "succeeded"), (Reply(status=410), "dead")])
async def test_a_dedup_key_is_free_again_once_its_job_finished(
    client: httpx.AsyncClient,
    auth: dict[str, str],
    receiver: Receiver,
    scheduler: Scheduler,
    reply: Reply,
    final: str,
) -> None:
    receiver.default = reply
    target = await make_target(client, auth, receiver.url())
    body = {"target_id": target["id"], "delay_s": 0.001, "dedup_key": "invoice-7", "max_attempts": 1}
    first = await client.post("/v1/jobs", json=body, headers=auth)
    assert first.status_code == 201
    held = await client.post("/v1/jobs", json=body, headers=auth)
    assert held.status_code == 409 and held.json()["job_id"] == first.json()["id"]
    await drive(scheduler, lambda: state_is(client, auth, first.json()["id"], final), message=final)
    again = await client.post("/v1/jobs", json=body, headers=auth)
    assert again.status_code == 201 and again.json()["id"] != first.json()["id"]
