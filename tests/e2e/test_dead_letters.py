"""The dead-letter queue API: filter, inspect, replay (as is or overridden), delete."""

from __future__ import annotations

import datetime as dt
import itertools
import uuid
from typing import Any

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from app.services.scheduler import Scheduler
from tests.conftest import make_job, make_target, new_tenant
from tests.receiver import Receiver, Reply, wait_for


async def letters(client: httpx.AsyncClient, auth: dict[str, str], **params: Any) -> list[dict[str, Any]]:
    response = await client.get("/v1/dead-letters", params=params, headers=auth)
    assert response.status_code == 200, response.text
    items: list[dict[str, Any]] = response.json()["items"]
    return items


async def dead_letter_jobs(
    client: httpx.AsyncClient, auth: dict[str, str], scheduler: Scheduler, target_id: str, count: int
) -> list[dict[str, Any]]:
    jobs = [
        await make_job(client, auth, target_id, payload={"n": i}, max_attempts=2, backoff_base_s=0.01)
        for i in range(count)
    ]

    async def all_dead() -> bool:
        await scheduler.run_once()
        states = [(await client.get(f"/v1/jobs/{j['id']}", headers=auth)).json()["state"] for j in jobs]
        return states == ["dead"] * count

    await wait_for(all_dead, timeout=60, message="jobs dead-lettered")
    return jobs


async def test_inspect_filter_replay_and_delete(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler, engine: AsyncEngine
) -> None:
    receiver.default = Reply(status=503, body=b"overloaded")
    failing = await make_target(client, auth, receiver.url("/a"))
    other = await make_target(client, auth, receiver.url("/b"))
    before = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=5)
    await dead_letter_jobs(client, auth, scheduler, failing["id"], 2)
    receiver.default = Reply(status=500)
    (other_job,) = await dead_letter_jobs(client, auth, scheduler, other["id"], 1)

    assert len(await letters(client, auth)) == 3
    assert len(await letters(client, auth, target_id=failing["id"])) == 2
    assert [d["job_id"] for d in await letters(client, auth, status_code=500)] == [other_job["id"]]
    assert len(await letters(client, auth, since=before.isoformat())) == 3
    assert await letters(client, auth, until=before.isoformat()) == []
    # Not a date-time, and a number (which lax parsing would take as Unix time): refused.
    for since in ("yesterday", "0.7789961795816632", "1767225600"):
        bad = await client.get("/v1/dead-letters", params={"since": since}, headers=auth)
        assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "since", since

    (letter,) = await letters(client, auth, status_code=500)
    detail = (await client.get(f"/v1/dead-letters/{letter['id']}", headers=auth)).json()
    assert detail["payload"] == {"n": 0} and detail["attempts"] == 2
    assert [(r["attempt"], r["status_code"]) for r in detail["runs"]] == [(1, 500), (2, 500)]
    assert detail["replayed_at"] is None

    # Replay as is: a fresh job, due now, delivered to the same target with the same payload.
    receiver.default = Reply(status=200)
    replay = await client.post(f"/v1/dead-letters/{letter['id']}/replay", headers=auth)
    assert replay.status_code == 201, replay.text
    new_job = replay.json()
    assert new_job["id"] != other_job["id"] and new_job["state"] == "scheduled" and new_job["attempt"] == 0
    assert new_job["target_id"] == other["id"] and new_job["payload"] == {"n": 0}
    assert new_job["max_attempts"] == 2

    async def replay_delivered() -> bool:
        await scheduler.run_once()
        state: str = (await client.get(f"/v1/jobs/{new_job['id']}", headers=auth)).json()["state"]
        return state == "succeeded"

    await wait_for(replay_delivered, timeout=60, message="replay delivered")
    replayed = (await client.get(f"/v1/dead-letters/{letter['id']}", headers=auth)).json()
    assert replayed["replay_job_id"] == new_job["id"] and replayed["replayed_at"]
    # The webhook-id is new: receivers see a new message, not a retry of the old one.
    last = receiver.requests[-1]
    assert last.path == "/b" and last.headers["webhook-id"] not in [
        r.headers["webhook-id"] for r in receiver.requests[:-1]
    ]

    # Replay with overrides.
    (first_a, _) = await letters(client, auth, target_id=failing["id"])
    overridden = await client.post(
        f"/v1/dead-letters/{first_a['id']}/replay",
        json={"payload": {"fixed": True}, "target_id": other["id"]},
        headers=auth,
    )
    assert overridden.status_code == 201
    assert overridden.json()["payload"] == {"fixed": True} and overridden.json()["target_id"] == other["id"]
    unknown_target = await client.post(
        f"/v1/dead-letters/{first_a['id']}/replay", json={"target_id": str(uuid.uuid4())}, headers=auth
    )
    assert unknown_target.status_code == 422 and unknown_target.json()["errors"][0]["field"] == "target_id"
    extra = await client.post(f"/v1/dead-letters/{first_a['id']}/replay", json={"colour": 1}, headers=auth)
    assert extra.status_code == 422 and extra.json()["errors"][0]["field"] == "colour"

    # Another tenant sees none of it.
    stranger = await new_tenant(engine)
    assert await letters(client, stranger) == []
    for method, path in (
        ("GET", f"/v1/dead-letters/{letter['id']}"),
        ("POST", f"/v1/dead-letters/{letter['id']}/replay"),
        ("DELETE", f"/v1/dead-letters/{letter['id']}"),
    ):
        assert (await client.request(method, path, headers=stranger)).status_code == 404

    # Delete.
    assert (await client.delete(f"/v1/dead-letters/{letter['id']}", headers=auth)).status_code == 204
    assert (await client.get(f"/v1/dead-letters/{letter['id']}", headers=auth)).status_code == 404
    assert (await client.delete(f"/v1/dead-letters/{letter['id']}", headers=auth)).status_code == 404
    assert len(await letters(client, auth)) == 2


async def test_bulk_replay_by_filter_is_rate_capped_and_skips_what_was_replayed(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler
) -> None:
    receiver.default = Reply(status=502)
    live = await make_target(client, auth, receiver.url("/live"))
    doomed = await make_target(client, auth, receiver.url("/doomed"))
    await dead_letter_jobs(client, auth, scheduler, live["id"], 3)
    await dead_letter_jobs(client, auth, scheduler, doomed["id"], 1)
    assert (await client.delete(f"/v1/targets/{doomed['id']}", headers=auth)).status_code == 204

    response = await client.post("/v1/dead-letters/replay", json={"rate_per_s": 2, "status_code": 502}, headers=auth)
    assert response.status_code == 200, response.text
    result = response.json()
    assert len(result["replayed"]) == 3 and result["skipped_deleted_target"] == 1
    due = [dt.datetime.fromisoformat(r["next_run_at"]) for r in result["replayed"]]
    # Two per second: each replay falls due half a second after the previous one.
    assert [round((b - a).total_seconds(), 3) for a, b in itertools.pairwise(due)] == [0.5, 0.5]

    again = (await client.post("/v1/dead-letters/replay", json={}, headers=auth)).json()
    assert again["replayed"] == []  # replayed ones are left alone by default...
    everything = (
        await client.post("/v1/dead-letters/replay", json={"include_replayed": True, "limit": 2}, headers=auth)
    ).json()
    assert len(everything["replayed"]) == 2  # ...unless asked, and the limit holds
    bad = await client.post("/v1/dead-letters/replay", json={"rate_per_s": 0}, headers=auth)
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "rate_per_s"

    receiver.default = Reply(status=200)
    job_ids = [r["job_id"] for r in result["replayed"]]

    async def delivered() -> bool:
        await scheduler.run_once()
        states = [(await client.get(f"/v1/jobs/{j}", headers=auth)).json()["state"] for j in job_ids]
        return states == ["succeeded"] * 3

    await wait_for(delivered, timeout=60, message="bulk replays delivered")
    for job_id, due_at in zip(job_ids, due, strict=True):
        (run,) = (await client.get(f"/v1/jobs/{job_id}/runs", headers=auth)).json()["items"]
        # The cap holds because no replay starts before its staggered due time (both on the
        # database's clock). How late each one starts depends on the poll, so that is not asserted.
        assert dt.datetime.fromisoformat(run["started_at"]) >= due_at


async def test_a_target_can_choose_which_statuses_to_retry(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler
) -> None:
    # This receiver answers 404 while a deployment rolls out, and 500 means "never retry".
    target = await make_target(client, auth, receiver.url("/custom"), retry_on_status=[404, 404, 503])
    assert target["retry_on_status"] == [404, 503]
    receiver.script = [Reply(status=404)]
    retried = await make_job(client, auth, target["id"], max_attempts=3, backoff_base_s=0.01)

    async def state(job: dict[str, Any]) -> str:
        await scheduler.run_once()
        value: str = (await client.get(f"/v1/jobs/{job['id']}", headers=auth)).json()["state"]
        return value

    await wait_for(lambda: _is(state(retried), "succeeded"), timeout=60, message="404 retried")
    receiver.script = [Reply(status=500)]
    not_retried = await make_job(client, auth, target["id"], max_attempts=3, backoff_base_s=0.01)
    await wait_for(lambda: _is(state(not_retried), "dead"), timeout=60, message="500 not retried")
    assert len((await client.get(f"/v1/jobs/{not_retried['id']}/runs", headers=auth)).json()["items"]) == 1

    for statuses in ([200], [99999], list(range(300, 450))):
        bad = await client.post(
            "/v1/targets", json={"name": "x", "url": receiver.url(), "retry_on_status": statuses}, headers=auth
        )
        assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "retry_on_status"
    reset = await client.patch(f"/v1/targets/{target['id']}", json={"retry_on_status": None}, headers=auth)
    assert reset.json()["retry_on_status"] is None


async def _is(value: Any, expected: str) -> bool:
    return bool(await value == expected)
