"""Schedule health end to end: a schedule whose receiver fails is reported failing once
(job.health.failing), however many of its occurrences fail, and recovered once
(job.health.recovered) after an occurrence succeeds, each event a signed delivery to a
subscribed target; fire times the misfire policy gives up count as failed occurrences; and
the CLI shows health. Real receiver on 127.0.0.1 (the job on /work, events on /events), the
scheduler's passes and the reaper's watch driven by the test."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine
from standardwebhooks.webhooks import Webhook

from app.services.reaper import Reaper, ReaperConfig
from app.services.scheduler import Scheduler
from tests.conftest import TEST_KEY_RING, make_job, make_target
from tests.e2e.live_server import live_server
from tests.e2e.test_client_cli import cli, cli_json
from tests.e2e.test_delivery import drive, get_job
from tests.e2e.test_processes import Processes
from tests.e2e.test_scheduling_semantics import OUTAGE_S, outage
from tests.receiver import Received, Receiver, Reply


def at(receiver: Receiver, path: str) -> list[Received]:
    return [r for r in receiver.requests if r.path == path]


def events_of(receiver: Receiver, secret: str) -> list[dict[str, Any]]:
    """The events received, their signatures checked with the subscribed target's secret."""
    bodies = []
    for request in at(receiver, "/events"):
        body: dict[str, Any] = Webhook(secret).verify(request.body, request.headers)
        assert request.headers["webhook-id"] == f"msg_{uuid.UUID(body['id']).hex}"
        bodies.append(body)
    return bodies


async def test_a_failing_schedule_is_reported_failing_once_and_recovered_once(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler, engine: AsyncEngine
) -> None:
    receiver.by_path["/work"] = Reply(status=500)
    work = await make_target(client, auth, receiver.url("/work"))
    events = await make_target(client, auth, receiver.url("/events"))
    subscribed = await client.post(
        "/v1/event-subscriptions",
        headers=auth,
        json={"target_id": events["id"], "types": ["job.health.failing", "job.health.recovered"]},
    )
    assert subscribed.status_code == 201, subscribed.text
    # One attempt an occurrence: each failed delivery is a failed occurrence.
    job = await make_job(client, auth, work["id"], every_s=1, max_attempts=1, name="nightly", labels={"team": "core"})
    reaper = Reaper(engine, ReaperConfig(), TEST_KEY_RING)

    async def reported(kind: str) -> bool:
        await reaper.watch()
        return any(event["type"] == kind for event in events_of(receiver, events["secret"]))

    await drive(scheduler, lambda: reported("job.health.failing"), timeout=60, message="job.health.failing")
    failing = await get_job(client, auth, job["id"])
    assert failing["health"] == "failing" and failing["consecutive_failures"] >= 1
    # More occurrences fail: still one failing event.
    runs_before = len(at(receiver, "/work"))
    await drive(scheduler, lambda: len(at(receiver, "/work")) >= runs_before + 2, timeout=30, message="more failures")
    await reaper.watch()

    receiver.by_path["/work"] = Reply(status=200)
    await drive(scheduler, lambda: reported("job.health.recovered"), timeout=60, message="job.health.recovered")
    for _ in range(3):  # a few more passes: nothing else to report
        await scheduler.run_once()
        await reaper.watch()
    await drive(scheduler, lambda: len(at(receiver, "/events")) == 2, timeout=10, message="both events delivered")

    kinds = [event["type"] for event in events_of(receiver, events["secret"])]
    assert kinds == ["job.health.failing", "job.health.recovered"]
    first, second = events_of(receiver, events["secret"])
    assert first["data"]["job_id"] == job["id"] and first["data"]["name"] == "nightly"
    assert first["data"]["labels"] == {"team": "core"} and first["data"]["health"] == "failing"
    assert first["data"]["consecutive_failures"] >= 1 and first["data"]["last_failure_at"] is not None
    assert first["data"]["last_error"] == "HTTP 500: ok"
    assert second["data"]["job_id"] == job["id"] and second["data"]["consecutive_failures"] == 0
    assert second["data"]["last_success_at"] is not None and second["data"]["health"] == "healthy"
    healthy = await get_job(client, auth, job["id"])
    assert healthy["health"] == "healthy" and healthy["last_success_at"] is not None


async def test_the_cli_shows_health_and_lists_by_it(receiver: Receiver, db_url: str, procs: Processes) -> None:
    async with live_server(procs, db_url) as server:
        target = await cli_json(server, "targets", "create", "--name", "hooks", "--url", receiver.url())
        job = await cli_json(server, "jobs", "create", "--target", target["id"], "--every", "3600", "--name", "hourly")
        table, _ = await cli(server, "jobs", "list", "--health", "unknown")
        header = table.splitlines()[0].split()
        assert header[:4] == ["id", "name", "state", "health"] and job["id"] in table
        assert table.splitlines()[2].split()[3] == "unknown"
        failing, _ = await cli(server, "jobs", "list", "--health", "failing")
        assert job["id"] not in failing
        detail, _ = await cli(server, "jobs", "get", job["id"])
        assert "health                unknown" in detail and "consecutive_failures  0" in detail
        _, err = await cli(server, "jobs", "list", "--health", "sick", expect=1)
        assert "health" in err


async def test_fire_times_the_misfire_policy_gave_up_count_as_failed_occurrences(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler, engine: AsyncEngine
) -> None:
    target = await make_target(client, auth, receiver.url("/work"))
    job = await make_job(client, auth, target["id"], every_s=60, misfire_policy="skip", misfire_grace_s=5)
    await outage(engine, job["id"], OUTAGE_S)  # 11 fire times missed, none delivered
    await scheduler.run_once()
    missed = await get_job(client, auth, job["id"])
    assert missed["consecutive_failures"] == 11 and missed["last_failure_at"] is not None
    assert missed["last_success_at"] is None
    await Reaper(engine, ReaperConfig(), TEST_KEY_RING).watch()
    assert (await get_job(client, auth, job["id"]))["health"] == "failing"


async def test_fire_times_a_deliberate_pause_kept_from_running_are_not_failures(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler, engine: AsyncEngine
) -> None:
    target = await make_target(client, auth, receiver.url("/work"))
    job = await make_job(client, auth, target["id"], every_s=60, misfire_policy="skip", misfire_grace_s=5)
    paused = await client.post(f"/v1/jobs/{job['id']}/pause", headers=auth)
    assert paused.status_code == 200, paused.text
    await outage(engine, job["id"], OUTAGE_S, paused=True)  # paused through 11 fire times
    resumed = await client.post(f"/v1/jobs/{job['id']}/resume", headers=auth)
    assert resumed.status_code == 200, resumed.text
    await scheduler.run_once()
    # The misfire policy still skips them (the runs say so), but they are not held against it.
    after = await get_job(client, auth, job["id"])
    assert after["consecutive_failures"] == 0 and after["last_failure_at"] is None
    await Reaper(engine, ReaperConfig(), TEST_KEY_RING).watch()
    assert (await get_job(client, auth, job["id"]))["health"] != "failing"
