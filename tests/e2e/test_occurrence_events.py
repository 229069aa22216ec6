"""Events about settled occurrences end to end (app/store/outcome_events.py): subscriptions
and per-job callbacks, written with the outcome they report, delivered as signed one-off jobs
to a real receiver on 127.0.0.1. Jobs answer on /work, events arrive on /events (and
callbacks on /ok and /failed)."""

from __future__ import annotations

import json
import signal
import uuid
from typing import Any

import httpx
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine
from standardwebhooks.webhooks import Webhook

from app.services.scheduler import Scheduler
from app.store.tables import jobs
from tests.conftest import make_job, make_target
from tests.e2e.test_delivery import drive
from tests.e2e.test_processes import Processes, short_lease_env
from tests.receiver import Received, Receiver, Reply, wait_for

QUICK_RETRIES = {"backoff_base_s": 0.05, "backoff_max_s": 0.1}


def at(receiver: Receiver, path: str) -> list[Received]:
    return [r for r in receiver.requests if r.path == path]


async def subscribe(client: httpx.AsyncClient, auth: dict[str, str], target_id: str, *types: str) -> dict[str, Any]:
    answer = await client.post("/v1/event-subscriptions", headers=auth, json={"target_id": target_id, "types": types})
    assert answer.status_code == 201, answer.text
    body: dict[str, Any] = answer.json()
    return body


async def unfinished(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        count = await conn.scalar(select(func.count()).where(jobs.c.state.not_in(["succeeded", "dead", "cancelled"])))
    return int(count or 0)


def opened(request: Received, secret: str) -> dict[str, Any]:
    """The event's body, its signature checked with the subscribed target's secret."""
    body: dict[str, Any] = Webhook(secret).verify(request.body, request.headers)
    # The webhook-id is the event's id: stable across the event's retries.
    assert request.headers["webhook-id"] == f"msg_{uuid.UUID(body['id']).hex}"
    return body


async def test_settled_occurrences_are_reported_once_each_and_events_never_about_events(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler, engine: AsyncEngine
) -> None:
    receiver.by_path["/bad"] = Reply(status=500)
    work = await make_target(client, auth, receiver.url("/work"))
    bad = await make_target(client, auth, receiver.url("/bad"))
    events = await make_target(client, auth, receiver.url("/events"))
    # The event target's own deliveries succeed too: were they reported, /events would never end.
    await subscribe(client, auth, events["id"], "occurrence.succeeded", "occurrence.dead_lettered")
    ok_job = await make_job(client, auth, work["id"], name="nightly", labels={"team": "core"})
    bad_job = await make_job(client, auth, bad["id"], max_attempts=2, **QUICK_RETRIES)

    async def settled() -> bool:
        return len(at(receiver, "/events")) >= 2 and await unfinished(engine) == 0

    await drive(scheduler, settled, timeout=60, message="both occurrences settled and reported")
    # One more pass: nothing else was due, so nothing else arrives.
    await scheduler.run_once()
    reported = {body["type"]: body for body in (opened(r, events["secret"]) for r in at(receiver, "/events"))}
    assert len(at(receiver, "/events")) == 2 and set(reported) == {"occurrence.succeeded", "occurrence.dead_lettered"}

    succeeded = reported["occurrence.succeeded"]
    (delivered,) = at(receiver, "/work")
    assert succeeded["data"]["job_id"] == ok_job["id"] and succeeded["data"]["name"] == "nightly"
    assert succeeded["data"]["labels"] == {"team": "core"}
    assert f"msg_{uuid.UUID(succeeded['data']['occurrence_id']).hex}" == delivered.headers["webhook-id"]
    assert succeeded["data"]["outcome"] == "success" and succeeded["data"]["status_code"] == 200
    assert succeeded["tenant_id"] and succeeded["created_at"]

    dead = reported["occurrence.dead_lettered"]["data"]
    assert dead["job_id"] == bad_job["id"] and dead["attempts"] == 2
    assert dead["outcome"] == "http_error" and dead["status_code"] == 500
    # The event deliveries are jobs of their own, visible in the API and marked as events.
    listed = await client.get("/v1/jobs", headers=auth, params={"target_id": events["id"]})
    assert listed.status_code == 200, listed.text
    assert sorted(job["event_type"] for job in listed.json()["items"]) == sorted(reported)


async def test_callbacks_fire_once_per_occurrence_whatever_its_attempts(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler, engine: AsyncEngine
) -> None:
    work = await make_target(client, auth, receiver.url("/work"))
    on_ok = await make_target(client, auth, receiver.url("/ok"))
    on_failed = await make_target(client, auth, receiver.url("/failed"))
    callbacks = {"on_success_target_id": on_ok["id"], "on_failure_target_id": on_failed["id"]}
    # Two failed attempts, then a success: one occurrence, one success callback.
    receiver.script = [Reply(status=500), Reply(status=503)]
    flaky = await make_job(client, auth, work["id"], max_attempts=5, **QUICK_RETRIES, **callbacks)
    await drive(scheduler, lambda: len(at(receiver, "/ok")) == 1, timeout=60, message="the success callback")
    assert len(at(receiver, "/work")) == 3

    # Every attempt fails: one failure callback, after the last.
    receiver.by_path["/work"] = Reply(status=500)
    doomed = await make_job(client, auth, work["id"], max_attempts=3, **QUICK_RETRIES, **callbacks)
    await drive(scheduler, lambda: len(at(receiver, "/failed")) == 1, timeout=60, message="the failure callback")

    async def all_settled() -> bool:
        return await unfinished(engine) == 0

    await drive(scheduler, all_settled, timeout=60, message="every job and callback settled")
    assert len(at(receiver, "/work")) == 6 and len(at(receiver, "/ok")) == 1 and len(at(receiver, "/failed")) == 1

    ok_event = opened(at(receiver, "/ok")[0], on_ok["secret"])
    assert ok_event["type"] == "occurrence.succeeded" and ok_event["data"]["job_id"] == flaky["id"]
    assert ok_event["data"]["attempts"] == 3
    failed_event = opened(at(receiver, "/failed")[0], on_failed["secret"])
    assert failed_event["type"] == "occurrence.dead_lettered" and failed_event["data"]["job_id"] == doomed["id"]
    assert failed_event["data"]["attempts"] == 3 and failed_event["data"]["status_code"] == 500


async def test_a_recurring_job_gets_one_callback_per_occurrence(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler
) -> None:
    work = await make_target(client, auth, receiver.url("/work"))
    on_ok = await make_target(client, auth, receiver.url("/ok"))
    job = await make_job(client, auth, work["id"], every_s=1, on_success_target_id=on_ok["id"])
    await drive(scheduler, lambda: len(at(receiver, "/ok")) >= 3, timeout=60, message="three callbacks")
    await client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth)
    occurrences = [opened(r, on_ok["secret"])["data"]["occurrence_id"] for r in at(receiver, "/ok")]
    delivered = {r.headers["webhook-id"] for r in at(receiver, "/work")}
    assert len(occurrences) == len(set(occurrences))
    assert {f"msg_{uuid.UUID(o).hex}" for o in occurrences} <= delivered


async def test_events_survive_a_scheduler_sigkill(
    client: httpx.AsyncClient,
    auth: dict[str, str],
    receiver: Receiver,
    engine: AsyncEngine,
    db_url: str,
    procs: Processes,
) -> None:
    """`cronhook scheduler` processes: the first is SIGKILLed while deliveries and their
    events are under way; the survivor finishes. Every occurrence is reported exactly once
    (one event id each); a delivery the victim made but could not record may come again, with
    the same webhook-id."""
    # Two at a time, 0.2 s each: the 30 take seconds, so the victim dies with most still to do
    # and the survivor has real work (were the victim done, this would test nothing).
    work = await make_target(client, auth, receiver.url("/work"), max_in_flight=2)
    events = await make_target(client, auth, receiver.url("/events"))
    await subscribe(client, auth, events["id"], "occurrence.succeeded")
    receiver.by_path["/work"] = Reply(delay_s=0.2)
    made = [await make_job(client, auth, work["id"], delay_s=0.5, payload={"n": n}) for n in range(30)]
    env = short_lease_env(db_url)

    victim = procs.start("scheduler-a", ["scheduler"], {**env, "CRONHOOK_REPLICA_ID": "victim"})
    await wait_for(lambda: len(at(receiver, "/events")) >= 3, timeout=60, message="events under way")
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=5)
    delivered_by_victim = {json.loads(r.body)["n"] for r in at(receiver, "/work")}
    assert len(delivered_by_victim) < len(made), "the victim finished everything before it was killed"
    procs.start("reaper", ["reaper"], env)
    procs.start("scheduler-b", ["scheduler"], {**env, "CRONHOOK_REPLICA_ID": "survivor"})

    async def all_reported() -> bool:
        ids = {json.loads(r.body)["data"]["occurrence_id"] for r in at(receiver, "/events")}
        return len(ids) == len(made) and await unfinished(engine) == 0

    await wait_for(all_reported, timeout=120, interval=0.2, message="every occurrence reported")
    bodies = [opened(r, events["secret"]) for r in at(receiver, "/events")]
    by_event: dict[str, set[str]] = {}
    for body in bodies:
        by_event.setdefault(body["id"], set()).add(body["data"]["occurrence_id"])
    # One event per occurrence, never two: a repeated delivery is the same event.
    assert len(by_event) == len(made) and all(len(occurrences) == 1 for occurrences in by_event.values())
    assert {body["data"]["job_id"] for body in bodies} == {job["id"] for job in made}
    # The survivor did the rest.
    assert {json.loads(r.body)["n"] for r in at(receiver, "/work")} == set(range(len(made)))


async def test_a_triggered_occurrence_calls_back_for_its_job(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler
) -> None:
    work = await make_target(client, auth, receiver.url("/work"))
    on_ok = await make_target(client, auth, receiver.url("/ok"))
    job = await make_job(client, auth, work["id"], every_s=3600, on_success_target_id=on_ok["id"])
    triggered = await client.post(f"/v1/jobs/{job['id']}/trigger", headers=auth)
    assert triggered.status_code in (200, 201, 202), triggered.text
    await drive(scheduler, lambda: len(at(receiver, "/ok")) == 1, timeout=60, message="the trigger's callback")
    event = opened(at(receiver, "/ok")[0], on_ok["secret"])
    # Named after the recurring job whose occurrence it carried.
    assert event["type"] == "occurrence.succeeded" and event["data"]["job_id"] == job["id"]
