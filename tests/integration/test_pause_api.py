"""Pause and hold through the API on a real PostgreSQL (app/api/routes/pauses.py,
app/store/pauses.py): what a pause holds and the claim then leaves alone, a resume's release
per on_resume and drain rate, the reaper's pass (app/services/hold_watch.py), a tenant's
pause, auto_pause on targets, events written once per edge, bad input and isolation.
Deliveries through a real scheduler are tests/e2e/test_target_pause.py's."""

from __future__ import annotations

import datetime as dt
import itertools
import uuid
from typing import Any

import httpx
import pytest
from sqlalchemy import func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.engine import create_engine
from app.services.hold_watch import hold_watch_once
from app.store.claims import _lease_limited, job_claim_batch
from app.store.job_rows import job_is_held
from app.store.tables import jobs, targets
from app.store.tables_watch import event_subscriptions
from tests.conftest import ADMIN, TEST_KEY_RING, make_job, make_target, new_tenant
from tests.problems import assert_problem
from tests.receiver import wait_for

URL = "http://127.0.0.1:9/hook"


@pytest.fixture
def api(admin_client: httpx.AsyncClient) -> httpx.AsyncClient:
    """The API with the admin key set (tenant pauses)."""
    return admin_client


async def job_rows(engine: AsyncEngine, target_id: str) -> list[Any]:
    async with engine.connect() as conn:
        stmt = select(jobs).where(jobs.c.target_id == uuid.UUID(target_id), jobs.c.event_type.is_(None))
        return list((await conn.execute(stmt.order_by(jobs.c.created_at))).mappings())


async def claim(engine: AsyncEngine, *ignored: dict[str, Any]) -> tuple[list[uuid.UUID], dt.datetime | None]:
    """Leases what is due (every partition) for a scheduler that then does nothing: the ids
    (but of jobs to the `ignored` targets), and the next due time the claim's probe saw."""
    async with engine.connect() as conn:
        batch = await job_claim_batch(conn, TEST_KEY_RING, "tester", 50, 60)
        await conn.commit()
    skipped = {uuid.UUID(target["id"]) for target in ignored}
    return [job.id for job in batch.jobs if job.target_id not in skipped], batch.next_due_at


async def subscribe(engine: AsyncEngine, auth_target: dict[str, Any], tenant_id: uuid.UUID) -> None:
    """The tenant subscribes `auth_target` to target.paused and target.resumed (the row
    POST /v1/event-subscriptions writes)."""
    async with engine.begin() as conn:
        await conn.execute(
            insert(event_subscriptions).values(
                tenant_id=tenant_id,
                target_id=uuid.UUID(auth_target["id"]),
                types=["target.paused", "target.resumed", "target.auto_paused"],
            )
        )


async def events(engine: AsyncEngine) -> list[dict[str, Any]]:
    async with engine.connect() as conn:
        stmt = select(jobs.c.payload).where(jobs.c.event_type.is_not(None)).order_by(jobs.c.created_at)
        return list((await conn.execute(stmt)).scalars())


async def tenant_of(engine: AsyncEngine, target_id: str) -> uuid.UUID:
    async with engine.connect() as conn:
        tenant: uuid.UUID = (
            await conn.execute(select(targets.c.tenant_id).where(targets.c.id == uuid.UUID(target_id)))
        ).scalar_one()
    return tenant


async def test_a_pause_holds_every_waiting_occurrence_until_the_resume_releases_them(
    api: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    auth = await new_tenant(engine)
    target = await make_target(api, auth, URL)
    watcher = await make_target(api, auth, "http://127.0.0.1:9/events")
    await subscribe(engine, watcher, await tenant_of(engine, target["id"]))
    due = [await make_job(api, auth, target["id"]) for _ in range(3)]
    later = await make_job(api, auth, target["id"], delay_s=3600)

    paused = await api.post(f"/v1/targets/{target['id']}/pause", headers=auth, json={"reason": "deploy"})
    assert paused.status_code == 200, paused.text
    body = paused.json()
    assert body["paused"] is True and body["pause_kind"] == "manual" and body["paused_reason"] == "deploy"
    assert body["held"] == 4 and body["paused_at"] is not None and body["paused_until"] is None
    rows = await job_rows(engine, target["id"])
    assert all(job_is_held(row) and row["state"] == "scheduled" for row in rows)
    # Nothing is claimed, and the claim's next due time is not a held one (nor 'infinity').
    claimed, next_due_at = await claim(engine, watcher)
    assert claimed == [] and next_due_at is None

    # Due while paused: left out by the claim, then held by the reaper's pass.
    fresh = await make_job(api, auth, target["id"])
    assert await claim(engine, watcher) == ([], None)
    assert await hold_watch_once(engine, 100) == 1
    assert all(job_is_held(row) for row in await job_rows(engine, target["id"]))

    # Pausing again changes what is sent, holds nothing new, and is no second edge.
    until = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=2)).isoformat()
    again = await api.post(f"/v1/targets/{target['id']}/pause", headers=auth, json={"until": until})
    assert again.status_code == 200 and again.json()["held"] == 0
    assert again.json()["paused_reason"] == "deploy" and again.json()["paused_until"] is not None
    assert again.json()["paused_at"] == body["paused_at"]
    read = (await api.get(f"/v1/targets/{target['id']}", headers=auth)).json()
    assert read["paused"] is True and read["paused_reason"] == "deploy"

    resumed = await api.post(f"/v1/targets/{target['id']}/resume", headers=auth)
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["released"] == 5 and resumed.json()["paused"] is False
    assert resumed.json()["pause_kind"] is None and resumed.json()["paused_reason"] is None
    by_id = {str(row["id"]): row for row in await job_rows(engine, target["id"])}
    assert not any(job_is_held(row) or row["held_run_at"] for row in by_id.values())
    # The one not due yet keeps its own time; the others are due now.
    assert by_id[later["id"]]["run_at"] > dt.datetime.now(dt.UTC) + dt.timedelta(minutes=50)
    claimed, _ = await claim(engine, watcher)
    assert {str(job_id) for job_id in claimed} == {job["id"] for job in [*due, fresh]}

    # One event per edge, and none for the second pause.
    sent = [event for event in await events(engine) if event["type"].startswith("target.")]
    assert [event["type"] for event in sent] == ["target.paused", "target.resumed"]
    assert sent[0]["data"] == {
        "target_id": target["id"],
        "name": "receiver",
        "reason": "deploy",
        "kind": "manual",
        "paused_until": None,
        "consecutive_failures": 0,
    }
    assert sent[1]["data"]["released"] == 5 and sent[1]["data"]["reason"] == "deploy"
    assert sent[1]["data"]["paused_until"] is not None
    # A second resume: nothing held, no edge, no event.
    twice = await api.post(f"/v1/targets/{target['id']}/resume", headers=auth, json={})
    assert twice.status_code == 200 and twice.json()["released"] == 0
    assert len([e for e in await events(engine) if e["type"].startswith("target.")]) == 2


async def test_a_resume_releases_per_on_resume_and_at_the_drain_rate(
    api: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    auth = await new_tenant(engine)
    target = await make_target(api, auth, URL)
    one_offs = [await make_job(api, auth, target["id"]) for _ in range(4)]
    hourly = await make_job(api, auth, target["id"], every_s=3600)
    for policy in ("misfire_policy", "deliver_all"):
        assert (await api.post(f"/v1/targets/{target['id']}/pause", headers=auth)).json()["held"] == 5
        # As if the pause had lasted two hours: the recurring job's occurrence is an hour late.
        async with engine.begin() as conn:
            two_hours = dt.timedelta(hours=2)
            await conn.execute(
                update(jobs)
                .where(jobs.c.id == uuid.UUID(hourly["id"]))
                .values(held_run_at=jobs.c.held_run_at - two_hours, scheduled_for=jobs.c.scheduled_for - two_hours)
            )
        before = dt.datetime.now(dt.UTC)
        body = {"on_resume": policy, "drain_rate_per_s": 2}
        resumed = await api.post(f"/v1/targets/{target['id']}/resume", headers=auth, json=body)
        assert resumed.status_code == 200 and resumed.json()["released"] == 5, resumed.text
        rows = {str(row["id"]): row for row in await job_rows(engine, target["id"])}
        spread = sorted(rows[job["id"]]["run_at"] for job in one_offs)
        # One every half second, in their order.
        gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(spread)]
        assert all(abs(gap - 0.5) < 0.01 for gap in gaps), gaps
        recurring = rows[hourly["id"]]
        if policy == "misfire_policy":
            # Its own time back: the misfire policy judges it an hour late.
            assert recurring["run_at"] == recurring["scheduled_for"] < before - dt.timedelta(minutes=50)
        else:
            # Due from the release, in its place in the order (it was the oldest).
            assert before - dt.timedelta(seconds=5) < recurring["run_at"] <= spread[0]


async def test_the_reaper_resumes_a_pause_whose_until_passed(api: httpx.AsyncClient, engine: AsyncEngine) -> None:
    auth = await new_tenant(engine)
    target = await make_target(api, auth, URL)
    await make_job(api, auth, target["id"])
    # An hour ahead, then moved into the past as the clock would: a `until` a second or two
    # ahead could pass before a busy machine's request checks it (422: not in the future).
    until = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    body = {"reason": "window", "until": until.isoformat()}
    assert (await api.post(f"/v1/targets/{target['id']}/pause", headers=auth, json=body)).json()["held"] == 1
    assert await hold_watch_once(engine, 100) == 0  # not yet
    assert (await api.get(f"/v1/targets/{target['id']}", headers=auth)).json()["paused"] is True
    async with engine.begin() as conn:
        passed = func.now() - dt.timedelta(seconds=1)
        await conn.execute(update(targets).where(targets.c.id == target["id"]).values(paused_until=passed))

    async def resumed() -> bool:
        await hold_watch_once(engine, 100)
        return (await api.get(f"/v1/targets/{target['id']}", headers=auth)).json()["paused"] is False

    await wait_for(resumed, timeout=15, interval=0.2, message="the pause ended by itself")
    assert not any(job_is_held(row) for row in await job_rows(engine, target["id"]))
    assert len((await claim(engine))[0]) == 1


async def test_held_occurrences_no_pause_holds_are_released_by_the_reaper(
    api: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    auth = await new_tenant(engine)
    paused, other = await make_target(api, auth, URL), await make_target(api, auth, URL + "2")
    job = await make_job(api, auth, paused["id"])
    await api.post(f"/v1/targets/{paused['id']}/pause", headers=auth)
    # A held job moved to a target no pause holds: not stranded there.
    async with engine.begin() as conn:
        await conn.execute(update(jobs).where(jobs.c.id == uuid.UUID(job["id"])).values(target_id=other["id"]))
    assert await claim(engine) == ([], None)
    assert await hold_watch_once(engine, 100) == 1
    assert [str(job_id) for job_id in (await claim(engine))[0]] == [job["id"]]


async def test_a_limited_candidate_of_a_target_paused_since_the_claim_is_not_leased(
    db_url: str, api: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    """An auto-pause trips between a claim statement (autocommit) and its limited targets'
    leases: their delivery slots are refused, though the jobs were not held yet."""
    auth = await new_tenant(engine)
    target = await make_target(api, auth, URL, max_in_flight=5)
    job = await make_job(api, auth, target["id"])
    candidates = [{"candidate_id": uuid.UUID(job["id"]), "candidate_target_id": uuid.UUID(target["id"])}]
    async with engine.begin() as conn:
        auto = {"paused_at": func.now(), "pause_kind": "auto"}
        await conn.execute(update(targets).where(targets.c.id == uuid.UUID(target["id"])).values(**auto))
    scheduler_engine = create_engine(db_url, pool_size=1, generic_plans=True)
    try:
        async with scheduler_engine.connect() as conn:
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            assert await _lease_limited(conn, candidates, {}, "r", 30) == []
            # A pause request on it says why, and leaves it the auto-pause it is.
            noted = await api.post(f"/v1/targets/{target['id']}/pause", headers=auth, json={"reason": "on call"})
            assert noted.json()["pause_kind"] == "auto" and noted.json()["paused_reason"] == "on call"
            assert noted.json()["held"] == 1
            await api.post(f"/v1/targets/{target['id']}/resume", headers=auth)
            (leased,) = await _lease_limited(conn, candidates, {}, "r", 30)
    finally:
        await scheduler_engine.dispose()
    # With the run_at it was due at, as the misfire check reads it.
    assert leased["id"] == uuid.UUID(job["id"]) and leased["candidate_run_at"] is not None


async def test_a_tenant_pause_holds_all_its_targets_and_no_one_elses(
    api: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    name = f"paused-{uuid.uuid4().hex[:6]}"
    auth, other_auth = await new_tenant(engine, name), await new_tenant(engine)
    first, second = await make_target(api, auth, URL), await make_target(api, auth, URL + "2")
    theirs = await make_target(api, other_auth, URL)
    for target in (first, second):
        await make_job(api, auth, target["id"])
    their_job = await make_job(api, other_auth, theirs["id"])
    await api.post(f"/v1/targets/{second['id']}/pause", headers=auth)

    paused = await api.post(f"/v1/admin/tenants/{name}/pause", headers=ADMIN, json={"reason": "billing"})
    assert paused.status_code == 200, paused.text
    assert paused.json()["paused"] is True and paused.json()["tenant"] == name and paused.json()["held"] == 1
    # The other tenant delivers as before.
    assert [str(job_id) for job_id in (await claim(engine))[0]] == [their_job["id"]]
    # Jobs created meanwhile are held too; a target's own resume releases nothing yet.
    await make_job(api, auth, first["id"])
    assert await hold_watch_once(engine, 100) == 1
    own = await api.post(f"/v1/targets/{first['id']}/resume", headers=auth)
    assert own.status_code == 200 and own.json()["released"] == 0
    assert await claim(engine) == ([], None)

    resumed = await api.post(f"/v1/admin/tenants/{name}/resume", headers=ADMIN, json={"on_resume": "deliver_all"})
    assert resumed.status_code == 200 and resumed.json()["paused"] is False and resumed.json()["released"] == 2
    # The target its users paused stays paused.
    assert len((await claim(engine))[0]) == 2
    assert (await api.get(f"/v1/targets/{second['id']}", headers=auth)).json()["paused"] is True
    assert all(job_is_held(row) for row in await job_rows(engine, second["id"]))

    assert_problem(await api.post("/v1/admin/tenants/nobody/pause", headers=ADMIN), 404, "tenant")
    refused = await api.post(f"/v1/admin/tenants/{name}/pause", headers=auth)
    assert refused.status_code == 403


async def test_auto_pause_is_a_field_of_a_target(api: httpx.AsyncClient, engine: AsyncEngine) -> None:
    auth = await new_tenant(engine)
    target = await make_target(api, auth, URL, auto_pause={"consecutive_failures": 3})
    assert target["auto_pause"] == {"consecutive_failures": 3} and target["consecutive_failures"] == 0
    assert target["paused"] is False and target["pause_kind"] is None
    patched = await api.patch(f"/v1/targets/{target['id']}", headers=auth, json={"auto_pause": None})
    assert patched.status_code == 200 and patched.json()["auto_pause"] is None
    put = await api.put(
        "/v1/targets/by-name/nightly", headers=auth, json={"url": URL, "auto_pause": {"consecutive_failures": 5}}
    )
    assert put.status_code == 201 and put.json()["auto_pause"] == {"consecutive_failures": 5}
    same = await api.put(
        "/v1/targets/by-name/nightly", headers=auth, json={"url": URL, "auto_pause": {"consecutive_failures": 5}}
    )
    assert same.status_code == 200 and same.json()["changed"] == [] and same.headers["etag"] == put.headers["etag"]
    # Left out of a PUT, it takes its default (none), as every field does.
    cleared = await api.put("/v1/targets/by-name/nightly", headers=auth, json={"url": URL})
    assert cleared.json()["changed"] == ["auto_pause"] and cleared.json()["auto_pause"] is None

    for bad in (0, -1, "3", 1.5, None):
        refused = await api.patch(
            f"/v1/targets/{target['id']}", headers=auth, json={"auto_pause": {"consecutive_failures": bad}}
        )
        assert_problem(refused, 422, "auto_pause.consecutive_failures")
    refused = await api.post("/v1/targets", headers=auth, json={"name": "x", "url": URL, "auto_pause": {}})
    assert_problem(refused, 422, "auto_pause.consecutive_failures")
    refused = await api.post("/v1/targets", headers=auth, json={"name": "x", "url": URL, "auto_pause": 3})
    assert_problem(refused, 422, "auto_pause")


async def test_bad_input_names_the_field_and_another_tenants_target_is_not_found(
    api: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    auth, other = await new_tenant(engine), await new_tenant(engine)
    target = await make_target(api, auth, URL)
    job = await make_job(api, auth, target["id"])
    path = f"/v1/targets/{target['id']}"
    past = (dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)).isoformat()
    cases = [
        ("pause", {"until": past}, "until"),
        ("pause", {"until": "tomorrow"}, "until"),
        ("pause", {"until": "2030-01-01T00:00:00"}, "until"),  # no offset
        ("pause", {"until": "2999-01-01T00:00:00Z"}, "until"),
        ("pause", {"reason": "x" * 501}, "reason"),
        ("pause", {"reason": "a\u0000b"}, "reason"),
        ("pause", {"hold": True}, "hold"),
        ("resume", {"on_resume": "later"}, "on_resume"),
        ("resume", {"drain_rate_per_s": 0}, "drain_rate_per_s"),
        ("resume", {"drain_rate_per_s": "5"}, "drain_rate_per_s"),
    ]
    for action, body, field in cases:
        assert_problem(await api.post(f"{path}/{action}", headers=auth, json=body), 422, field)
    assert_problem(await api.post("/v1/targets/not-a-uuid/pause", headers=auth), 422, "target_id")
    # Another tenant's target: not found, and untouched.
    for action in ("pause", "resume"):
        assert_problem(await api.post(f"{path}/{action}", headers=other), 404)
        assert_problem(await api.post(f"/v1/targets/{uuid.uuid4()}/{action}", headers=auth), 404)
    assert not any(job_is_held(row) for row in await job_rows(engine, target["id"]))
    assert (await api.get(path, headers=auth)).json()["paused"] is False
    assert [str(job_id) for job_id in (await claim(engine))[0]] == [job["id"]]
