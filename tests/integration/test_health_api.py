"""Schedule health in the API, on a real PostgreSQL: the fields every job carries, `expect`
and the per-job callbacks as inputs (validated, through create, batch, PATCH, PUT and sets),
`?health=` on the jobs list, tenant defaults through the admin limits API, and the health
watch's edges (app/services/health_watch.py) driven by a job's record, set with SQL."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.health import HealthDefaults
from app.services.health_watch import health_watch_once
from app.store.health import job_count_by_health
from app.store.tables import jobs, targets
from app.store.tables_watch import event_subscriptions
from tests.conftest import ADMIN, make_job, make_target, new_tenant
from tests.problems import assert_problem, row_counts

DEFAULTS = HealthDefaults()


async def record(engine: AsyncEngine, job_id: str, **values: Any) -> None:
    """Sets a job's health record, as the outcome statement and the misfire settle keep it."""
    async with engine.begin() as conn:
        await conn.execute(update(jobs).where(jobs.c.id == uuid.UUID(job_id)).values(**values))


async def get(client: httpx.AsyncClient, auth: dict[str, str], job_id: str) -> dict[str, Any]:
    answer = await client.get(f"/v1/jobs/{job_id}", headers=auth)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


async def listed(client: httpx.AsyncClient, auth: dict[str, str], **params: str) -> set[str]:
    answer = await client.get("/v1/jobs", headers=auth, params=params)
    assert answer.status_code == 200, answer.text
    return {item["id"] for item in answer.json()["items"]}


async def health_events(engine: AsyncEngine) -> list[dict[str, Any]]:
    """The health events written (event deliveries), oldest first: their bodies."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(jobs.c.payload).where(jobs.c.event_type.like("job.health.%")).order_by(jobs.c.created_at, jobs.c.id)
        )
        return [row.payload for row in rows]


async def subscribe(engine: AsyncEngine, client: httpx.AsyncClient, auth: dict[str, str], target_id: str) -> None:
    """A subscription to the health events (written with SQL: the subscriptions API is not
    this test's subject)."""
    async with engine.begin() as conn:
        tenant_id = await conn.scalar(select(targets.c.tenant_id).where(targets.c.id == uuid.UUID(target_id)))
        await conn.execute(
            event_subscriptions.insert().values(
                tenant_id=tenant_id,
                target_id=uuid.UUID(target_id),
                types=["job.health.failing", "job.health.recovered"],
            )
        )


async def test_every_job_carries_its_health_record_and_thresholds(
    client: httpx.AsyncClient, auth: dict[str, str]
) -> None:
    target = await make_target(client, auth, "https://example.com/hook")
    other = await make_target(client, auth, "https://example.com/other")
    job = await make_job(
        client,
        auth,
        target["id"],
        every_s=60,
        expect={"success_within_s": 3600, "max_consecutive_failures": 3},
        on_success_target_id=other["id"],
        on_failure_target_id=other["id"],
    )
    assert job["health"] == "unknown" and job["consecutive_failures"] == 0
    assert job["last_success_at"] is None and job["last_failure_at"] is None and job["event_type"] is None
    assert job["expect"] == {"success_within_s": 3600, "max_consecutive_failures": 3}
    assert job["on_success_target_id"] == other["id"] and job["on_failure_target_id"] == other["id"]
    assert await get(client, auth, job["id"]) == job
    # A one-off sets no thresholds, but may have callbacks.
    one_off = await make_job(client, auth, target["id"], on_failure_target_id=other["id"])
    assert one_off["expect"] is None and one_off["on_failure_target_id"] == other["id"]


async def test_bad_expect_and_callbacks_are_422_naming_the_field_and_write_nothing(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine
) -> None:
    target = await make_target(client, auth, "https://example.com/hook")
    foreign = await make_target(client, await new_tenant(engine), "https://example.com/theirs")
    recurring = {"target_id": target["id"], "every_s": 60}
    before = await row_counts(engine)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"target_id": target["id"], "delay_s": 5, "expect": {"max_consecutive_failures": 2}}, "expect"),
        ({**recurring, "expect": {}}, "expect"),
        ({**recurring, "expect": {"success_within_s": 0}}, "expect.success_within_s"),
        ({**recurring, "expect": {"max_consecutive_failures": 0}}, "expect.max_consecutive_failures"),
        ({**recurring, "expect": {"max_consecutive_failures": "3"}}, "expect.max_consecutive_failures"),
        ({**recurring, "expect": {"within": 5}}, "expect.within"),
        ({**recurring, "on_success_target_id": str(uuid.uuid4())}, "on_success_target_id"),
        # Another tenant's target is no target of this one.
        ({**recurring, "on_failure_target_id": foreign["id"]}, "on_failure_target_id"),
    ]
    for body, field in cases:
        assert_problem(await client.post("/v1/jobs", headers=auth, json=body), 422, field)
    parent = await make_job(client, auth, target["id"], every_s=60)
    after = {"target_id": target["id"], "after": {"job_id": parent["id"]}, "expect": {"success_within_s": 60}}
    assert_problem(await client.post("/v1/jobs", headers=auth, json=after), 422, "expect")
    batch = {"jobs": [recurring, {**recurring, "on_success_target_id": foreign["id"]}]}
    assert_problem(await client.post("/v1/jobs/batch", headers=auth, json=batch), 422, "jobs[1].on_success_target_id")
    bad_expect = {
        "jobs": [{**recurring, "run_at": None, "every_s": None, "delay_s": 5, "expect": {"success_within_s": 9}}]
    }
    assert_problem(await client.post("/v1/jobs/batch", headers=auth, json=bad_expect), 422, "jobs[0].expect")
    after_counts = await row_counts(engine)
    assert {k: v for k, v in after_counts.items() if k != "audit_log"} == {
        k: v + (1 if k == "jobs" else 0) for k, v in before.items() if k != "audit_log"
    }


async def test_patch_put_and_sets_change_expect_and_callbacks(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine
) -> None:
    target = await make_target(client, auth, "https://example.com/hook")
    other = await make_target(client, auth, "https://example.com/other")
    foreign = await make_target(client, await new_tenant(engine), "https://example.com/theirs")
    job = await make_job(client, auth, target["id"], every_s=60)

    changed = await client.patch(
        f"/v1/jobs/{job['id']}",
        headers=auth,
        json={"expect": {"max_consecutive_failures": 2}, "on_success_target_id": other["id"]},
    )
    assert changed.status_code == 200, changed.text
    body = changed.json()
    assert body["expect"] == {"success_within_s": None, "max_consecutive_failures": 2}
    assert body["on_success_target_id"] == other["id"] and body["next_run_at"] == job["next_run_at"]
    path = f"/v1/jobs/{job['id']}"
    assert_problem(
        await client.patch(path, headers=auth, json={"on_failure_target_id": foreign["id"]}),
        422,
        "on_failure_target_id",
    )
    assert_problem(
        await client.patch(path, headers=auth, json={"expect": {"max_consecutive_failures": 0}}),
        422,
        "expect.max_consecutive_failures",
    )
    cleared = await client.patch(path, headers=auth, json={"expect": None, "on_success_target_id": None})
    assert cleared.json()["expect"] is None and cleared.json()["on_success_target_id"] is None
    # Made a one-off, a job drops its thresholds; a one-off takes none.
    await client.patch(path, headers=auth, json={"expect": {"success_within_s": 600}})
    once = await client.patch(path, headers=auth, json={"delay_s": 600})
    assert once.status_code == 200 and once.json()["expect"] is None
    assert_problem(await client.patch(path, headers=auth, json={"expect": {"success_within_s": 60}}), 422, "expect")

    schedule = {"target_id": target["id"], "every_s": 60, "expect": {"success_within_s": 900}}
    put = await client.put("/v1/schedules/nightly", headers=auth, json=schedule)
    assert put.status_code == 201, put.text
    assert put.json()["expect"] == {"success_within_s": 900, "max_consecutive_failures": None}
    assert put.json()["health"] == "unknown"
    again = await client.put("/v1/schedules/nightly", headers=auth, json=schedule)
    assert again.status_code == 200 and again.json()["changed"] == []
    moved = await client.put(
        "/v1/schedules/nightly", headers=auth, json={**schedule, "on_failure_target_id": other["id"], "expect": None}
    )
    assert moved.json()["changed"] == ["expect", "on_failure_target_id"], moved.text
    assert moved.json()["expect"] is None and moved.json()["on_failure_target_id"] == other["id"]
    refused = await client.put(
        "/v1/schedules/nightly", headers=auth, json={**schedule, "on_success_target_id": foreign["id"]}
    )
    assert_problem(refused, 422, "on_success_target_id")
    got = await client.get("/v1/schedules/nightly", headers=auth)
    assert got.status_code == 200 and got.json()["health"] == "unknown"

    items = [
        {"key": "a", "target_id": target["id"], "every_s": 60, "expect": {"max_consecutive_failures": 5}},
        {"key": "b", "target_id": target["id"], "every_s": 60, "on_success_target_id": foreign["id"]},
    ]
    answer = await client.put("/v1/schedule-sets/ops", headers=auth, json={"schedules": items})
    assert_problem(answer, 422, "schedules[1].on_success_target_id")
    items[1]["on_success_target_id"] = other["id"]
    answer = await client.put("/v1/schedule-sets/ops", headers=auth, json={"schedules": items})
    assert answer.status_code == 200, answer.text
    listed_schedules = (await client.get("/v1/schedules", headers=auth, params={"set": "ops"})).json()["items"]
    by_key = {item["key"]: item for item in listed_schedules}
    assert by_key["a"]["expect"] == {"success_within_s": None, "max_consecutive_failures": 5}
    assert by_key["b"]["on_success_target_id"] == other["id"] and "expect" not in by_key["b"]


async def test_the_watch_reports_each_edge_once_and_the_api_shows_its_verdict(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine
) -> None:
    target = await make_target(client, auth, "https://example.com/hook")
    events = await make_target(client, auth, "https://example.com/events")
    await subscribe(engine, client, auth, events["id"])
    flaky = await make_job(client, auth, target["id"], every_s=60, name="flaky", labels={"team": "core"})
    patient = await make_job(client, auth, target["id"], every_s=60, expect={"max_consecutive_failures": 3})
    fine = await make_job(client, auth, target["id"], every_s=60)

    await record(engine, flaky["id"], consecutive_failures=1, last_failure_at=func.now(), last_error="HTTP 500")
    await record(engine, patient["id"], consecutive_failures=2, last_failure_at=func.now())
    await record(engine, fine["id"], last_success_at=func.now())
    assert await health_watch_once(engine, DEFAULTS, 500) == 1
    assert await health_watch_once(engine, DEFAULTS, 500) == 0  # an edge is reported once
    (failing,) = await health_events(engine)
    assert failing["type"] == "job.health.failing"
    data = failing["data"]
    assert data["job_id"] == flaky["id"] and data["name"] == "flaky" and data["labels"] == {"team": "core"}
    assert data["health"] == "failing" and data["consecutive_failures"] == 1 and data["last_error"] == "HTTP 500"
    assert data["last_failure_at"] is not None and data["last_success_at"] is None and data["schedule_key"] is None

    assert (await get(client, auth, flaky["id"]))["health"] == "failing"
    assert (await get(client, auth, patient["id"]))["health"] == "unknown"  # 2 of its 3
    assert (await get(client, auth, fine["id"]))["health"] == "healthy"
    assert await listed(client, auth, health="failing") == {flaky["id"]}
    assert await listed(client, auth, health="healthy") == {fine["id"]}
    assert_problem(await client.get("/v1/jobs", headers=auth, params={"health": "sick"}), 422, "health")

    # A pause neither makes a job failing nor recovers it.
    await record(engine, patient["id"], consecutive_failures=3)
    await client.post(f"/v1/jobs/{patient['id']}/pause", headers=auth)
    await record(engine, flaky["id"], consecutive_failures=0, last_success_at=func.now())
    await client.post(f"/v1/jobs/{flaky['id']}/pause", headers=auth)
    assert await health_watch_once(engine, DEFAULTS, 500) == 0
    assert (await get(client, auth, patient["id"]))["health"] == "paused"
    assert await listed(client, auth, health="paused") == {patient["id"], flaky["id"]}
    await client.post(f"/v1/jobs/{flaky['id']}/resume", headers=auth)
    assert await health_watch_once(engine, DEFAULTS, 500) == 1
    recovered = (await health_events(engine))[-1]
    assert recovered["type"] == "job.health.recovered" and recovered["data"]["job_id"] == flaky["id"]
    assert recovered["data"]["health"] == "healthy" and recovered["data"]["consecutive_failures"] == 0
    assert (await get(client, auth, flaky["id"]))["health"] == "healthy"
    assert len(await health_events(engine)) == 2


async def test_deadlines_and_thresholds_come_from_the_job_else_the_tenant_else_the_settings(
    admin_client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    client, name = admin_client, "health-defaults"
    auth = await new_tenant(engine, name)
    target = await make_target(client, auth, "https://example.com/hook")
    own = await make_job(client, auth, target["id"], every_s=60, expect={"success_within_s": 600})
    plain = await make_job(client, auth, target["id"], every_s=60)
    one_off = await make_job(client, auth, target["id"], delay_s=3600)
    an_hour_ago = func.now() - func.make_interval(0, 0, 0, 0, 1)
    for job in (own, plain, one_off):
        await record(engine, job["id"], created_at=an_hour_ago, last_success_at=an_hour_ago)
    assert await health_watch_once(engine, DEFAULTS, 500) == 1  # its own deadline passed
    assert (await get(client, auth, own["id"]))["health"] == "failing"
    assert (await get(client, auth, plain["id"]))["health"] == "healthy"

    # A tenant default deadline reaches its recurring jobs without one of their own.
    limits = await client.put(f"/v1/admin/tenants/{name}/limits", headers=ADMIN, json={"expect_success_within_s": 1800})
    assert limits.status_code == 200, limits.text
    assert limits.json()["overrides"]["expect_success_within_s"] == 1800
    assert limits.json()["effective"]["expect_success_within_s"] == 1800
    assert limits.json()["effective"]["expect_max_consecutive_failures"] == 1  # the settings'
    assert await health_watch_once(engine, DEFAULTS, 500) == 1
    assert await listed(client, auth, health="failing") == {own["id"], plain["id"]}  # not the one-off

    # A tenant's max_consecutive_failures; a job's own wins over it.
    limits = await client.put(
        f"/v1/admin/tenants/{name}/limits", headers=ADMIN, json={"expect_max_consecutive_failures": 3}
    )
    assert limits.json()["effective"]["expect_max_consecutive_failures"] == 3
    assert "expect_success_within_s" not in limits.json()["effective"]  # none: no deadline
    await record(engine, plain["id"], last_success_at=func.now(), consecutive_failures=2)
    await record(engine, own["id"], last_success_at=func.now(), consecutive_failures=2)
    await client.patch(f"/v1/jobs/{own['id']}", headers=auth, json={"expect": {"max_consecutive_failures": 2}})
    assert await health_watch_once(engine, DEFAULTS, 500) == 1  # plain recovered, own still failing
    assert await listed(client, auth, health="failing") == {own["id"]}
    bad = await client.put(f"/v1/admin/tenants/{name}/limits", headers=ADMIN, json={"expect_success_within_s": 0})
    assert_problem(bad, 422, "expect_success_within_s")
    # The settings' defaults, for tenants that set none.
    assert await health_watch_once(engine, HealthDefaults(max_consecutive_failures=1), 500) == 0


async def test_the_gauge_counts_unfinished_jobs_by_health(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine
) -> None:
    target = await make_target(client, auth, "https://example.com/hook")
    late = await make_job(client, auth, target["id"], every_s=60)
    failing = await make_job(client, auth, target["id"], every_s=60)
    paused = await make_job(client, auth, target["id"], every_s=60)
    await make_job(client, auth, target["id"], every_s=60)
    await record(engine, late["id"], run_at=func.now() - func.make_interval(0, 0, 0, 0, 1), last_success_at=func.now())
    await record(engine, failing["id"], consecutive_failures=1)
    await client.post(f"/v1/jobs/{paused['id']}/pause", headers=auth)
    await health_watch_once(engine, DEFAULTS, 500)
    async with engine.connect() as conn:
        counts = await job_count_by_health(conn)
    assert {health.value: count for health, count in counts.items()} == {
        "healthy": 0,
        "late": 1,
        "failing": 1,
        "paused": 1,
        "unknown": 1,
    }
    metrics = await client.get("/metrics")
    assert 'cronhook_jobs_by_health{health="failing"}' in metrics.text
