"""A create for a key this process has authenticated before goes in one statement that checks
the key itself (app/api/job_creates.py:
KnownKeys, create_for_known_key). These tests first make the key known, then check that the one-statement
path ran and that it answers as the full path would: a key revoked meanwhile is a 401 with
nothing written, refusals name their field, a dead pooled connection fails no request, and a
create whose answer was lost with its connection is answered once, not written twice."""

from __future__ import annotations

import datetime as dt
import uuid
import zoneinfo
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import ColumnElement, func, select, text, update
from sqlalchemy.ext.asyncio import AsyncEngine

import app.api.job_creates as job_creates
import app.store.job_inserts as job_inserts
from app.api.app import create_app
from app.settings import Settings
from app.store.tables import api_keys, audit_log, jobs
from app.store.tenants import hash_api_key
from tests.conftest import make_target, new_tenant
from tests.integration.test_dead_connections import end_other_sessions

# What create_for_known_key answered, per call: "created" or "full path".
Outcomes = list[str]


@pytest.fixture
async def outcomes(monkeypatch: pytest.MonkeyPatch) -> Outcomes:
    seen: Outcomes = []
    original = job_creates.create_for_known_key

    async def spy(*args: Any, **kwargs: Any) -> Any:
        result = await original(*args, **kwargs)
        seen.append("full path" if result is None else "created")
        return result

    monkeypatch.setattr(job_creates, "create_for_known_key", spy)
    return seen


@pytest.fixture
def service(settings: Settings, engine: AsyncEngine) -> FastAPI:
    return create_app(settings, engine=engine)


@pytest.fixture
async def lean(service: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=service)
    async with httpx.AsyncClient(transport=transport, base_url="http://cronhook.test") as http:
        yield http


def _at(days: float = 1) -> str:
    return (dt.datetime.now(dt.UTC) + dt.timedelta(days=days)).isoformat()


async def _known_key(client: httpx.AsyncClient, engine: AsyncEngine) -> tuple[dict[str, str], str]:
    """A tenant's key, made known by a first create (the full path), and its target's id."""
    auth = await new_tenant(engine)
    target = await make_target(client, auth, "http://127.0.0.1:9/hook")
    first = await client.post("/v1/jobs", json={"target_id": target["id"], "run_at": _at()}, headers=auth)
    assert first.status_code == 201, first.text
    return auth, target["id"]


async def _count(engine: AsyncEngine, *where: ColumnElement[bool]) -> int:
    async with engine.connect() as conn:
        return int(await conn.scalar(select(func.count()).select_from(jobs).where(*where)) or 0)


async def test_a_known_keys_create_is_one_statement_and_the_same_job(
    lean: httpx.AsyncClient, engine: AsyncEngine, outcomes: Outcomes
) -> None:
    auth, target_id = await _known_key(lean, engine)
    assert outcomes == []  # the first create of a key looks the key up
    run_at = _at(3)
    body = {"target_id": target_id, "run_at": run_at, "payload": {"n": 7}, "priority": 2, "max_attempts": 4}
    created = await lean.post("/v1/jobs", json=body, headers={**auth, "X-Request-Id": "known-1"})
    assert created.status_code == 201, created.text
    assert outcomes == ["created"]
    job = created.json()
    assert (job["payload"], job["priority"], job["max_attempts"], job["state"]) == ({"n": 7}, 2, 4, "scheduled")
    assert dt.datetime.fromisoformat(job["next_run_at"]) == dt.datetime.fromisoformat(run_at)
    # As stored, and audited with the request's id and the key that made it.
    stored = await lean.get(f"/v1/jobs/{job['id']}", headers=auth)
    assert stored.json() == job
    key_hash = hash_api_key(auth["Authorization"].removeprefix("Bearer "))
    async with engine.connect() as conn:
        key_id = await conn.scalar(select(api_keys.c.id).where(api_keys.c.key_hash == key_hash))
        row = (await conn.execute(select(audit_log).where(audit_log.c.object_id == job["id"]))).one()
    assert (row.action, row.request_id, row.api_key_id) == ("createJob", "known-1", key_id)
    # A recurring schedule is planned from the exact clock: the full path.
    cron = await lean.post("/v1/jobs", json={"target_id": target_id, "cron": "0 9 * * *"}, headers=auth)
    assert cron.status_code == 201
    assert outcomes == ["created", "full path"]


async def test_a_known_keys_delay_is_one_statement_due_that_long_after_it(
    lean: httpx.AsyncClient, service: FastAPI, engine: AsyncEngine, outcomes: Outcomes
) -> None:
    auth, target_id = await _known_key(lean, engine)
    known_keys = service.state.quick_create.known_keys
    # The clock this process last saw, an hour behind the database's (an idle API process):
    # the job is planned from it, and still falls due `delay_s` after the INSERT.
    assert known_keys.now is not None
    known_keys.now -= dt.timedelta(hours=1)
    for delay_s in (30, 0.25, 86_400):
        created = await lean.post("/v1/jobs", json={"target_id": target_id, "delay_s": delay_s}, headers=auth)
        assert created.status_code == 201, created.text
        job = created.json()
        async with engine.connect() as conn:
            row = (await conn.execute(select(jobs).where(jobs.c.id == uuid.UUID(job["id"])))).one()
        # created_at is the INSERT's now(): the same instant the delay is counted from.
        assert row.scheduled_for - row.created_at == dt.timedelta(seconds=delay_s)
        assert row.run_at == row.scheduled_for == row.schedule_anchor_at
        assert dt.datetime.fromisoformat(job["next_run_at"]) == row.run_at
        assert (await lean.get(f"/v1/jobs/{job['id']}", headers=auth)).json() == job
    assert outcomes == ["created"] * 3
    assert known_keys.now > dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)  # caught up
    # Its bounds hold as on the full path: too long a delay is a 422 naming delay_s.
    too_long = await lean.post("/v1/jobs", json={"target_id": target_id, "delay_s": 10**12}, headers=auth)
    assert too_long.status_code == 422 and too_long.json()["errors"][0]["field"] == "delay_s"


async def test_a_stale_clock_moves_a_delay_on_in_seconds_whatever_the_sessions_time_zone(
    lean: httpx.AsyncClient, service: FastAPI, engine: AsyncEngine, outcomes: Outcomes
) -> None:
    auth, target_id = await _known_key(lean, engine)
    # Sessions in a zone with daylight saving time, and a clock last seen over a year ago: a
    # shift in calendar days would be 23 or 25 h per day across a change.
    async with engine.connect() as conn:
        name = await conn.scalar(select(func.current_database()))
        await conn.execute(text(f"ALTER DATABASE \"{name}\" SET timezone = 'Europe/Berlin'"))
        await conn.commit()
    await engine.dispose()  # new sessions take the database's setting
    known_keys = service.state.quick_create.known_keys
    assert known_keys.now is not None
    berlin = zoneinfo.ZoneInfo("Europe/Berlin")
    # Whole days back to a time on the other side of a change (summer time now, or not).
    days = next(
        d
        for d in range(30, 366, 15)
        if (known_keys.now - dt.timedelta(days=d)).astimezone(berlin).dst() != known_keys.now.astimezone(berlin).dst()
    )
    known_keys.now -= dt.timedelta(days=days)
    created = await lean.post("/v1/jobs", json={"target_id": target_id, "delay_s": 30}, headers=auth)
    assert created.status_code == 201, created.text
    assert outcomes == ["created"]
    async with engine.connect() as conn:
        assert await conn.scalar(text("SHOW timezone")) == "Europe/Berlin"
        row = (await conn.execute(select(jobs).where(jobs.c.id == uuid.UUID(created.json()["id"])))).one()
    assert row.scheduled_for - row.created_at == dt.timedelta(seconds=30)


async def test_a_key_revoked_after_it_became_known_creates_nothing(
    lean: httpx.AsyncClient, engine: AsyncEngine, outcomes: Outcomes
) -> None:
    auth, target_id = await _known_key(lean, engine)
    key_hash = hash_api_key(auth["Authorization"].removeprefix("Bearer "))
    async with engine.begin() as conn:
        await conn.execute(update(api_keys).where(api_keys.c.key_hash == key_hash).values(revoked_at=func.now()))
    refused = await lean.post("/v1/jobs", json={"target_id": target_id, "run_at": _at()}, headers=auth)
    assert refused.status_code == 401, refused.text
    assert refused.headers["content-type"] == "application/problem+json"
    assert outcomes == ["full path"]  # tried in one statement, which wrote nothing
    assert await _count(engine, jobs.c.target_id == uuid.UUID(target_id)) == 1  # the first create only
    # Forgotten: the next request looks the key up straight away.
    again = await lean.post("/v1/jobs", json={"target_id": target_id, "run_at": _at()}, headers=auth)
    assert again.status_code == 401 and outcomes == ["full path"]


async def test_refusals_of_a_known_key_name_their_field(
    lean: httpx.AsyncClient, engine: AsyncEngine, outcomes: Outcomes
) -> None:
    auth, target_id = await _known_key(lean, engine)
    other = await make_target(lean, await new_tenant(engine), "http://127.0.0.1:9/other")
    held = await lean.post(
        "/v1/jobs", json={"target_id": target_id, "run_at": _at(), "dedup_key": "nightly"}, headers=auth
    )
    assert held.status_code == 201 and outcomes == ["created"]
    cases = [
        ({"target_id": other["id"]}, 422, "target_id"),
        ({"target_id": str(uuid.uuid4())}, 422, "target_id"),
        ({"dedup_key": "nightly"}, 409, "dedup_key"),
        ({"run_at": _at(days=365 * 200)}, 422, "run_at"),
        ({"cron": "0 9 * * *"}, 422, "cron"),  # two schedules
    ]
    for fields, status, field in cases:
        answer = await lean.post("/v1/jobs", json={"target_id": target_id, "run_at": _at(), **fields}, headers=auth)
        assert answer.status_code == status, (fields, answer.text)
        assert answer.json()["errors"][0]["field"] == field, answer.json()
    assert outcomes == ["created"] + ["full path"] * len(cases)
    assert (
        await lean.post("/v1/jobs", json={"target_id": target_id, "run_at": _at()}, headers=auth)
    ).status_code == 201
    assert await _count(engine, jobs.c.target_id == uuid.UUID(target_id)) == 3


async def test_a_known_keys_create_succeeds_after_the_pooled_connections_died(
    lean: httpx.AsyncClient, engine: AsyncEngine, db_url: str, outcomes: Outcomes
) -> None:
    auth, target_id = await _known_key(lean, engine)
    assert await end_other_sessions(db_url) >= 1
    created = await lean.post("/v1/jobs", json={"target_id": target_id, "run_at": _at()}, headers=auth)
    assert created.status_code == 201, created.text
    # Either the INSERT met the dead connection (nothing written; the full path answered), or
    # asyncpg had already seen the closed socket and the pool opened a fresh connection for
    # it: which one depends on whether the event loop read the EOF first. One job either way.
    assert outcomes in (["full path"], ["created"])
    assert await _count(engine, jobs.c.target_id == uuid.UUID(target_id)) == 2


async def test_a_known_keys_create_succeeds_when_its_quota_read_meets_a_dead_connection(
    lean: httpx.AsyncClient, service: FastAPI, engine: AsyncEngine, db_url: str, outcomes: Outcomes
) -> None:
    auth, target_id = await _known_key(lean, engine)
    async with engine.connect() as conn:
        tenant_id = await conn.scalar(select(jobs.c.tenant_id).where(jobs.c.target_id == uuid.UUID(target_id)))
    # The next create reads the tenant's limits first. (Only those: Quotas.forget would also
    # drop the key's request-rate chunk, whose refill, on a connection of its own, would meet
    # the dead connection first and have the pool replaced.)
    quotas = service.state.quotas
    quotas._limits.pop(tenant_id)
    quotas._active.pop(tenant_id, None)
    assert await end_other_sessions(db_url) >= 1
    created = await lean.post("/v1/jobs", json={"target_id": target_id, "run_at": _at()}, headers=auth)
    assert created.status_code == 201, created.text
    assert outcomes == ["full path"]
    assert await _count(engine, jobs.c.target_id == uuid.UUID(target_id)) == 2


async def test_a_create_whose_answer_died_with_its_connection_is_answered_once(
    lean: httpx.AsyncClient, engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch, outcomes: Outcomes
) -> None:
    auth, target_id = await _known_key(lean, engine)
    original = job_inserts.job_create_for_key  # the function job_creates calls

    async def committed_then_lost(*args: Any) -> Any:
        await original(*args)  # in autocommit: the job and its audit row are written
        raise ConnectionResetError("the connection died before the answer arrived")

    monkeypatch.setattr(job_creates, "job_create_for_key", committed_then_lost)
    created = await lean.post("/v1/jobs", json={"target_id": target_id, "run_at": _at(2)}, headers=auth)
    assert created.status_code == 201, created.text
    assert outcomes == ["created"]  # found by its id, not created again
    assert await _count(engine, jobs.c.target_id == uuid.UUID(target_id)) == 2
    listed = await lean.get("/v1/jobs", params={"target_id": target_id}, headers=auth)
    assert created.json()["id"] in [job["id"] for job in listed.json()["items"]]
