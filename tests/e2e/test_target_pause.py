"""Pause and hold end to end (app/store/pauses.py, app/services/hold_watch.py): the API, a
real scheduler's passes, the reaper's and a real receiver on 127.0.0.1. Jobs answer on
/work (or /failing), events arrive on /events."""

from __future__ import annotations

import asyncio
import datetime as dt
import inspect
import itertools
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from sqlalchemy import func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine
from standardwebhooks.webhooks import Webhook

from app.services.hold_watch import hold_watch_once
from app.services.reaper import Reaper, ReaperConfig
from app.services.scheduler import Scheduler
from app.store.job_rows import job_is_held
from app.store.jobs import db_now
from app.store.tables import jobs, targets
from app.store.tables_watch import event_subscriptions
from tests.conftest import ADMIN, TEST_KEY_RING, make_job, make_target, new_tenant
from tests.e2e.test_delivery import drive, get_job, get_runs
from tests.receiver import Received, Receiver, Reply, wait_for


@pytest.fixture
def api(admin_client: httpx.AsyncClient) -> httpx.AsyncClient:
    """The API with the admin key set (tenant pauses)."""
    return admin_client


def at(receiver: Receiver, path: str) -> list[Received]:
    return [r for r in receiver.requests if r.path == path]


def scheduled_for(request: Received) -> dt.datetime:
    return dt.datetime.fromisoformat(request.headers["cronhook-scheduled-for"].replace("Z", "+00:00"))


async def subscribe(engine: AsyncEngine, tenant_id: uuid.UUID, target: dict[str, Any], *types: str) -> None:
    """The subscription POST /v1/event-subscriptions makes, written as its row."""
    async with engine.begin() as conn:
        row = {"tenant_id": tenant_id, "target_id": uuid.UUID(target["id"]), "types": list(types)}
        await conn.execute(insert(event_subscriptions).values(**row))


async def tenant_of(engine: AsyncEngine, target: dict[str, Any]) -> uuid.UUID:
    async with engine.connect() as conn:
        stmt = select(targets.c.tenant_id).where(targets.c.id == uuid.UUID(target["id"]))
        tenant_id: uuid.UUID = (await conn.execute(stmt)).scalar_one()
    return tenant_id


async def run_passes(scheduler: Scheduler, engine: AsyncEngine, until: Callable[[], Any], seconds: float) -> None:
    """Scheduler and reaper passes (the reaper's over paused targets) until `until()` holds."""

    async def step() -> bool:
        await hold_watch_once(engine, 500)
        await scheduler.run_once()
        result = until()
        return bool(await result if inspect.isawaitable(result) else result)

    await wait_for(step, timeout=seconds, interval=0.05, message=str(until))


async def passes_until_db_time(scheduler: Scheduler, engine: AsyncEngine, moment: dt.datetime) -> None:
    """Passes (as run_forever makes them) until the database's clock is past `moment`."""

    async def past() -> bool:
        async with engine.connect() as conn:
            return await db_now(conn) > moment

    await run_passes(scheduler, engine, past, seconds=60)


async def held_jobs(engine: AsyncEngine, target: dict[str, Any]) -> int:
    async with engine.connect() as conn:
        rows = (await conn.execute(select(jobs).where(jobs.c.target_id == uuid.UUID(target["id"])))).mappings()
        return sum(1 for row in rows if job_is_held(row))


async def test_a_pause_holds_through_due_times_and_deliver_all_delivers_every_held_occurrence(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler, engine: AsyncEngine
) -> None:
    work = await make_target(client, auth, receiver.url("/work"))
    events = await make_target(client, auth, receiver.url("/events"))
    await subscribe(engine, await tenant_of(engine, work), events, "target.paused", "target.resumed")
    one_offs = [await make_job(client, auth, work["id"], delay_s=1) for _ in range(3)]
    # Its misfire grace is much shorter than the pause: judged from its fire time, it would be given up.
    every = await make_job(client, auth, work["id"], every_s=1, misfire_grace_s=2)
    paused = await client.post(f"/v1/targets/{work['id']}/pause", headers=auth, json={"reason": "deploy"})
    assert paused.status_code == 200 and paused.json()["held"] == 4, paused.text
    first_fire = dt.datetime.fromisoformat((await get_job(client, auth, every["id"]))["scheduled_for"])

    # Well past every due time and the grace: nothing delivered, no attempt made, nothing missed.
    await passes_until_db_time(scheduler, engine, first_fire + dt.timedelta(seconds=5))
    assert at(receiver, "/work") == []
    for job in [*one_offs, every]:
        read = await get_job(client, auth, job["id"])
        assert read["state"] == "scheduled" and read["attempt"] == 0, read
        assert await get_runs(client, auth, job["id"]) == []
    assert await held_jobs(engine, work) == 4

    resumed = await client.post(f"/v1/targets/{work['id']}/resume", headers=auth, json={"on_resume": "deliver_all"})
    assert resumed.status_code == 200 and resumed.json()["released"] == 4, resumed.text

    def recurring() -> list[Received]:
        return [r for r in at(receiver, "/work") if r.headers["cronhook-job-id"] == every["id"]]

    await drive(scheduler, lambda: len(at(receiver, "/work")) >= 3 and recurring(), message="the held ones")
    await client.post(f"/v1/jobs/{every['id']}/cancel", headers=auth)
    one_off_ids = [r.headers["cronhook-job-id"] for r in at(receiver, "/work") if r not in recurring()]
    assert sorted(one_off_ids) == sorted(job["id"] for job in one_offs)
    # The recurring job's held occurrence was delivered, however late, not given up.
    assert scheduled_for(recurring()[0]) == first_fire
    first_run = (await get_runs(client, auth, every["id"]))[0]
    assert first_run["outcome"] == "success" and dt.datetime.fromisoformat(first_run["scheduled_for"]) == first_fire

    # One event per edge, signed, delivered once each.
    await drive(scheduler, lambda: len(at(receiver, "/events")) >= 2, message="both events")
    await scheduler.run_once()
    bodies = [Webhook(events["secret"]).verify(r.body, r.headers) for r in at(receiver, "/events")]
    assert [body["type"] for body in bodies] == ["target.paused", "target.resumed"]
    assert len({r.headers["webhook-id"] for r in at(receiver, "/events")}) == 2
    assert bodies[0]["data"]["target_id"] == work["id"] and bodies[0]["data"]["reason"] == "deploy"
    assert bodies[0]["data"]["kind"] == "manual" and bodies[1]["data"]["released"] == 4


async def test_resume_by_misfire_policy_judges_each_held_occurrence_by_its_own_time(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler, engine: AsyncEngine
) -> None:
    work = await make_target(client, auth, receiver.url("/work"))
    once = await make_job(client, auth, work["id"], delay_s=1)
    every = await make_job(client, auth, work["id"], every_s=1, misfire_policy="skip", misfire_grace_s=0.5)
    await client.post(f"/v1/targets/{work['id']}/pause", headers=auth)
    first_fire = dt.datetime.fromisoformat((await get_job(client, auth, every["id"]))["scheduled_for"])
    await passes_until_db_time(scheduler, engine, first_fire + dt.timedelta(seconds=3))
    assert at(receiver, "/work") == []

    body = {"on_resume": "misfire_policy"}
    resumed = await client.post(f"/v1/targets/{work['id']}/resume", headers=auth, json=body)
    assert resumed.status_code == 200 and resumed.json()["released"] == 2

    async def settled() -> bool:
        runs = await get_runs(client, auth, every["id"])
        return any(run["outcome"] == "success" for run in runs) and len(at(receiver, "/work")) >= 2

    await drive(scheduler, settled, message="the one-off and the recurring job's next on-time fire")
    await client.post(f"/v1/jobs/{every['id']}/cancel", headers=auth)
    # A one-off has no misfire policy: delivered.
    assert [r.headers["cronhook-job-id"] for r in at(receiver, "/work")].count(once["id"]) == 1
    # skip: the held occurrence, seconds late, was given up as it would have been unheld.
    runs = await get_runs(client, auth, every["id"])
    missed = [dt.datetime.fromisoformat(run["scheduled_for"]) for run in runs if run["outcome"] == "missed"]
    assert first_fire in missed
    delivered = [scheduled_for(r) for r in at(receiver, "/work") if r.headers["cronhook-job-id"] == every["id"]]
    assert first_fire not in delivered and delivered


async def test_drain_rate_spreads_the_release_in_the_occurrences_order(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler, engine: AsyncEngine
) -> None:
    work = await make_target(client, auth, receiver.url("/work"))
    made = [await make_job(client, auth, work["id"], payload={"n": n}) for n in range(6)]
    await client.post(f"/v1/targets/{work['id']}/pause", headers=auth)
    rate = 4.0
    body = {"drain_rate_per_s": rate}
    resumed = await client.post(f"/v1/targets/{work['id']}/resume", headers=auth, json=body)
    assert resumed.json()["released"] == 6

    async def times(column: Any) -> list[dt.datetime]:
        async with engine.connect() as conn:
            stmt = select(jobs.c.id, column).where(jobs.c.target_id == uuid.UUID(work["id"]))
            found = {str(row[0]): row[1] for row in await conn.execute(stmt)}
        return [found[job["id"]] for job in made]

    # One due every 1/rate s, in the order they were due.
    due = await times(jobs.c.run_at)
    assert all(abs((b - a).total_seconds() - 1 / rate) < 0.001 for a, b in itertools.pairwise(due)), due
    await drive(scheduler, lambda: len(at(receiver, "/work")) == 6, message="all six")
    # None POSTed before its turn (the database and the receiver share this machine's clock),
    # nor claimed earlier than the scheduler's claim-ahead allows; each once.
    posted = {r.headers["cronhook-job-id"]: r.at for r in at(receiver, "/work")}
    assert all(posted[job["id"]] >= due_at.timestamp() for job, due_at in zip(made, due, strict=True)), (posted, due)
    ahead = dt.timedelta(seconds=scheduler.config.claim_ahead_s)
    claimed = await times(jobs.c.occurrence_claimed_at)
    assert all(claimed_at >= due_at - ahead for claimed_at, due_at in zip(claimed, due, strict=True)), (claimed, due)
    assert len({r.headers["webhook-id"] for r in at(receiver, "/work")}) == 6


async def test_a_pause_until_a_time_ends_by_itself(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler, engine: AsyncEngine
) -> None:
    work = await make_target(client, auth, receiver.url("/work"))
    job = await make_job(client, auth, work["id"])
    # An hour ahead, then moved to now as the clock would: a `until` a second or two ahead
    # could pass before a busy machine's request checks it (422: not in the future).
    body = {"until": (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).isoformat()}
    assert (await client.post(f"/v1/targets/{work['id']}/pause", headers=auth, json=body)).json()["held"] == 1
    reaper = Reaper(engine, ReaperConfig(), TEST_KEY_RING)
    await reaper.run_once()
    await scheduler.run_once()
    assert at(receiver, "/work") == []  # held until then
    async with engine.begin() as conn:
        ended = await conn.execute(
            update(targets)
            .where(targets.c.id == work["id"])
            .values(paused_until=func.now())
            .returning(targets.c.paused_until)
        )
        until = ended.scalar_one()

    async def delivered() -> bool:
        await reaper.run_once()
        await scheduler.run_once()
        return len(at(receiver, "/work")) == 1

    await wait_for(delivered, timeout=60, interval=0.1, message="delivered once the pause ended")
    read = (await client.get(f"/v1/targets/{work['id']}", headers=auth)).json()
    assert read["paused"] is False and read["paused_until"] is None
    async with engine.connect() as conn:
        first_claim = (
            await conn.execute(select(jobs.c.occurrence_claimed_at).where(jobs.c.id == uuid.UUID(job["id"])))
        ).scalar_one()
    assert first_claim >= until


async def test_an_attempt_in_flight_when_the_pause_comes_ends_as_it_would_have(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler, engine: AsyncEngine
) -> None:
    answer = asyncio.Event()
    receiver.by_path["/work"] = Reply(hold=answer)
    work = await make_target(client, auth, receiver.url("/work"))
    job = await make_job(client, auth, work["id"])

    async def under_way() -> bool:
        if not scheduler.in_flight:
            await scheduler.run_once(wait=False)
        return len(at(receiver, "/work")) == 1

    await wait_for(under_way, timeout=30, message="the attempt under way")
    paused = await client.post(f"/v1/targets/{work['id']}/pause", headers=auth)
    assert paused.status_code == 200 and paused.json()["held"] == 0
    answer.set()

    async def succeeded() -> bool:
        return bool((await get_job(client, auth, job["id"]))["state"] == "succeeded")

    await wait_for(succeeded, timeout=30, message="the attempt recorded")
    assert len(at(receiver, "/work")) == 1


async def test_a_tenant_pause_holds_all_its_targets_and_does_not_stop_others(
    api: httpx.AsyncClient, receiver: Receiver, scheduler: Scheduler, engine: AsyncEngine
) -> None:
    name = f"paused-{uuid.uuid4().hex[:6]}"
    mine, theirs = await new_tenant(engine, name), await new_tenant(engine)
    a, b = await make_target(api, mine, receiver.url("/a")), await make_target(api, mine, receiver.url("/b"))
    other = await make_target(api, theirs, receiver.url("/other"))
    paused = await api.post(f"/v1/admin/tenants/{name}/pause", headers=ADMIN, json={"reason": "unpaid"})
    assert paused.status_code == 200, paused.text
    for target, auth in ((a, mine), (b, mine), (other, theirs)):
        await make_job(api, auth, target["id"], delay_s=0.5)
    await run_passes(scheduler, engine, lambda: len(at(receiver, "/other")) == 1, seconds=60)
    await passes_until_db_time(scheduler, engine, dt.datetime.now(dt.UTC) + dt.timedelta(seconds=2))
    assert at(receiver, "/a") == at(receiver, "/b") == []
    assert await held_jobs(engine, a) == await held_jobs(engine, b) == 1

    resumed = await api.post(f"/v1/admin/tenants/{name}/resume", headers=ADMIN)
    assert resumed.status_code == 200 and resumed.json()["released"] == 2
    await drive(scheduler, lambda: len(at(receiver, "/a")) == len(at(receiver, "/b")) == 1, message="both")
    # Another tenant's target: not found, and its pause not theirs to make.
    assert (await api.post(f"/v1/targets/{other['id']}/pause", headers=mine)).status_code == 404


async def test_auto_pause_trips_at_exactly_n_failed_attempts_and_holds_the_rest(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler, engine: AsyncEngine
) -> None:
    receiver.by_path["/failing"] = Reply(status=500)
    # One delivery at a time, so each failure is recorded before the next attempt starts.
    failing = await make_target(
        client, auth, receiver.url("/failing"), max_in_flight=1, auto_pause={"consecutive_failures": 3}
    )
    events = await make_target(client, auth, receiver.url("/events"))
    await subscribe(engine, await tenant_of(engine, failing), events, "target.auto_paused")
    made = [await make_job(client, auth, failing["id"], max_attempts=1) for _ in range(6)]

    async def tripped() -> bool:
        return bool((await client.get(f"/v1/targets/{failing['id']}", headers=auth)).json()["paused"])

    await run_passes(scheduler, engine, tripped, seconds=60)
    target = (await client.get(f"/v1/targets/{failing['id']}", headers=auth)).json()
    assert target["pause_kind"] == "auto" and target["consecutive_failures"] == 3
    # More passes: nothing else is attempted, the rest are held.
    await passes_until_db_time(scheduler, engine, dt.datetime.now(dt.UTC) + dt.timedelta(seconds=2))
    await drive(scheduler, lambda: len(at(receiver, "/events")) == 1, message="target.auto_paused")
    assert len(at(receiver, "/failing")) == 3
    assert await held_jobs(engine, failing) == 3
    event = Webhook(events["secret"]).verify(at(receiver, "/events")[0].body, at(receiver, "/events")[0].headers)
    assert event["type"] == "target.auto_paused" and event["data"]["consecutive_failures"] == 3
    assert event["data"]["kind"] == "auto" and event["data"]["target_id"] == failing["id"]

    # Fixed; resumed: the rest are delivered, and the failure count starts again.
    receiver.by_path["/failing"] = Reply(status=200)
    resumed = await client.post(f"/v1/targets/{failing['id']}/resume", headers=auth)
    assert resumed.json()["released"] == 3 and resumed.json()["consecutive_failures"] == 0
    await drive(scheduler, lambda: len(at(receiver, "/failing")) == 6, message="the held three")
    delivered = {r.headers["cronhook-job-id"] for r in at(receiver, "/failing")}
    assert delivered == {job["id"] for job in made}
