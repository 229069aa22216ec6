"""Named schedules (PUT/GET/DELETE /v1/schedules/{key}, app/api/schedule_upserts.py) on a real
PostgreSQL: created once, a PUT that changes nothing writes nothing, a change applies as a PATCH
would, conditional requests, concurrent PUTs of one key, the key freed by a delete, bad input."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store.tables import audit_log, jobs, runs
from tests.conftest import make_job, make_target
from tests.problems import assert_problem
from tests.receiver import Receiver


async def count_jobs(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int(await conn.scalar(select(func.count()).select_from(jobs)) or 0)


async def put(
    client: httpx.AsyncClient, auth: dict[str, str], key: str, body: dict[str, Any], **headers: str
) -> httpx.Response:
    return await client.put(f"/v1/schedules/{key}", headers={**auth, **headers}, json=body)


async def test_a_put_creates_once_then_changes_nothing_when_nothing_differs(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, engine: AsyncEngine
) -> None:
    target = await make_target(client, auth, receiver.url())
    body = {"target_id": target["id"], "cron": "H 3 * * *", "timezone": "Europe/Berlin", "payload": {"report": "daily"}}
    created = await put(client, auth, "nightly-report", body)
    assert created.status_code == 201, created.text
    job = created.json()
    assert job["key"] == "nightly-report" and {"cron", "payload", "target_id"} <= set(job["changed"])
    tag = created.headers["etag"]

    again = await put(client, auth, "nightly-report", body)
    assert again.status_code == 200, again.text
    same = again.json()
    assert same["changed"] == [] and again.headers["etag"] == tag
    assert (same["id"], same["next_run_at"], same["scheduled_for"], same["updated_at"], same["resolved_cron"]) == (
        job["id"],
        job["next_run_at"],
        job["scheduled_for"],
        job["updated_at"],
        job["resolved_cron"],
    )
    assert await count_jobs(engine) == 1
    # One audit row per PUT (the create's written with its job).
    async with engine.connect() as conn:
        audited = await conn.scalar(select(func.count()).where(audit_log.c.action == "putSchedule"))
    assert audited == 2
    read = await client.get("/v1/schedules/nightly-report", headers=auth)
    assert read.status_code == 200 and read.headers["etag"] == tag and read.json()["id"] == job["id"]


async def test_a_new_payload_keeps_the_fire_time_and_a_new_schedule_recomputes_it(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, engine: AsyncEngine
) -> None:
    target = await make_target(client, auth, receiver.url())
    body: dict[str, Any] = {"target_id": target["id"], "every_s": 3600, "payload": {"v": 1}, "misfire_policy": "skip"}
    first = (await put(client, auth, "sync", body)).json()

    body["payload"] = {"v": 2}
    changed = await put(client, auth, "sync", body)
    assert changed.status_code == 200 and changed.json()["changed"] == ["payload"]
    assert changed.json()["next_run_at"] == first["next_run_at"] and changed.json()["payload"] == {"v": 2}

    # Left out, a policy returns to its default; the schedule stands.
    del body["misfire_policy"]
    reset = (await put(client, auth, "sync", body)).json()
    assert reset["changed"] == ["misfire_policy"] and reset["misfire_policy"] == "fire_once"
    assert reset["next_run_at"] == first["next_run_at"]

    body["every_s"] = 60
    moved = (await put(client, auth, "sync", body)).json()
    assert moved["changed"] == ["every_s"] and moved["next_run_at"] != first["next_run_at"]
    assert moved["id"] == first["id"] and await count_jobs(engine) == 1
    async with engine.connect() as conn:
        assert await conn.scalar(select(func.count()).select_from(runs)) == 0


async def test_conditional_puts_answer_412_and_write_nothing(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, engine: AsyncEngine
) -> None:
    target = await make_target(client, auth, receiver.url())
    body = {"target_id": target["id"], "every_s": 600}
    assert (await put(client, auth, "cleanup", body, **{"If-Match": '"abc"'})).status_code == 412
    assert await count_jobs(engine) == 0
    created = await put(client, auth, "cleanup", body, **{"If-None-Match": "*"})
    assert created.status_code == 201, created.text
    tag = created.headers["etag"]
    assert_problem(await put(client, auth, "cleanup", body, **{"If-None-Match": "*"}), 412)
    stale = await put(client, auth, "cleanup", {**body, "every_s": 60}, **{"If-Match": '"0123"'})
    assert_problem(stale, 412)
    assert (await client.get("/v1/schedules/cleanup", headers=auth)).json()["every_s"] == 600
    fresh = await put(client, auth, "cleanup", {**body, "every_s": 60}, **{"If-Match": tag})
    assert fresh.status_code == 200 and fresh.headers["etag"] != tag


async def test_twenty_concurrent_puts_of_one_key_leave_one_job(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, engine: AsyncEngine
) -> None:
    target = await make_target(client, auth, receiver.url())
    body = {"target_id": target["id"], "cron": "*/5 * * * *"}
    answers = await asyncio.gather(*(put(client, auth, "every-five", body) for _ in range(20)))
    assert sorted(a.status_code for a in answers) == [200] * 19 + [201], [a.text for a in answers if a.is_error]
    assert len({a.json()["id"] for a in answers}) == 1
    assert await count_jobs(engine) == 1


async def test_a_delete_frees_the_key_at_once(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver
) -> None:
    target = await make_target(client, auth, receiver.url())
    body = {"target_id": target["id"], "every_s": 60}
    first = (await put(client, auth, "heartbeat", body)).json()
    deleted = await client.delete("/v1/schedules/heartbeat", headers=auth)
    assert deleted.status_code == 200 and deleted.json()["state"] == "cancelled"
    assert (await client.get("/v1/schedules/heartbeat", headers=auth)).status_code == 404
    second = await put(client, auth, "heartbeat", body)
    assert second.status_code == 201 and second.json()["id"] != first["id"]
    assert (await client.delete("/v1/schedules/nothing-here", headers=auth)).status_code == 404


async def test_bad_keys_and_bodies_are_refused_naming_the_field(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, engine: AsyncEngine
) -> None:
    target = await make_target(client, auth, receiver.url())
    body = {"target_id": target["id"], "every_s": 60}
    for key in ("Upper", "-dash-first", "sp ace", "a" * 201, "preview"):
        answer = await put(client, auth, key, body)
        assert answer.status_code in (404, 422), (key, answer.text)
        if answer.status_code == 422:
            assert_problem(answer, 422, "key")
    assert_problem(await put(client, auth, "one-off", {"target_id": target["id"], "delay_s": 5}), 422, "delay_s")
    assert_problem(await put(client, auth, "no-target", {"every_s": 5}), 422, "target_id")
    holder = await make_job(client, auth, target["id"], delay_s=60, dedup_key="nightly")
    taken = await put(client, auth, "dup", {"target_id": target["id"], "every_s": 60, "dedup_key": "nightly"})
    body_ = assert_problem(taken, 409, "dedup_key")
    assert body_["job_id"] == holder["id"]
    assert await count_jobs(engine) == 1
