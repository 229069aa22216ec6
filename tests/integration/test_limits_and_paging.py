"""README promises at the edges of the API: the documented input limits (each a 422 naming the
field, writing nothing), /readyz when the schema is behind, paging through every list, and
Idempotency-Key scoped per endpoint."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import httpx
import pytest
from alembic import command
from sqlalchemy import func, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.app import create_app
from app.db.migrate import alembic_config, head_revision, migrate_to_head, revision_of
from app.services.scheduler import Scheduler
from app.services.scheduler_config import SchedulerConfig
from app.settings import Settings
from app.store.tables import jobs
from tests.conftest import TEST_KEY_RING, make_job, make_target
from tests.problems import assert_problem, row_counts
from tests.receiver import wait_for

DAY_S = 86_400


async def db_now(engine: AsyncEngine) -> dt.datetime:
    async with engine.connect() as conn:
        now: dt.datetime | None = await conn.scalar(select(func.now()))
    assert now is not None
    return now


def headers(count: int) -> dict[str, str]:
    return {f"x-h{i}": "v" for i in range(count)}


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"headers": headers(33)}, "headers"),
        *[({"headers": {name: "x"}}, "headers") for name in ("Host", "content-type", "Content-Length", "user-agent")],
        ({"headers": {"webhook-id": "x"}}, "headers"),
        ({"headers": {"Cronhook-Attempt": "1"}}, "headers"),
        ({"rate_per_s": 10_000.5}, "rate_per_s"),
        ({"rate_per_s": 0.0009}, "rate_per_s"),
    ],
)
async def test_target_limits_are_422_naming_the_field_and_write_nothing(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine, fields: dict[str, Any], field: str
) -> None:
    before = await row_counts(engine)
    response = await client.post(
        "/v1/targets", json={"name": "t", "url": "http://127.0.0.1:9/h", **fields}, headers=auth
    )
    assert_problem(response, 422, field)
    assert await row_counts(engine) == before


async def test_target_limits_accept_their_largest_values(client: httpx.AsyncClient, auth: dict[str, str]) -> None:
    target = await make_target(client, auth, "http://127.0.0.1:9/h", headers=headers(32), rate_per_s=10_000)
    assert len(target["headers"]) == 32 and target["rate_per_s"] == 10_000
    slow = await make_target(client, auth, "http://127.0.0.1:9/h", rate_per_s=0.001)
    assert slow["rate_per_s"] == 0.001


@pytest.mark.date_sensitive
async def test_schedule_limits_are_422_naming_the_field_and_write_nothing(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine
) -> None:
    target = await make_target(client, auth, "http://127.0.0.1:9/h")
    now = await db_now(engine)
    # Ten years ahead: days 3640 and 3660 lie either side, whatever the leap days.
    within, beyond = now + dt.timedelta(days=3640), now + dt.timedelta(days=3660)
    for schedule, field in (
        ({"every_s": 366 * DAY_S + 1}, "every_s"),
        ({"delay_s": 3660 * DAY_S}, "delay_s"),
        ({"run_at": beyond.isoformat()}, "run_at"),
        ({"run_at": "1999-12-31T23:59:59Z"}, "run_at"),
    ):
        before = await row_counts(engine)
        response = await client.post("/v1/jobs", json={"target_id": target["id"], **schedule}, headers=auth)
        assert_problem(response, 422, field)
        assert await row_counts(engine) == before
    # The largest values are accepted.
    assert (await make_job(client, auth, target["id"], every_s=366 * DAY_S))["every_s"] == 366 * DAY_S
    assert await make_job(client, auth, target["id"], delay_s=3640 * DAY_S)
    at = await make_job(client, auth, target["id"], run_at=within.isoformat())
    assert dt.datetime.fromisoformat(at["next_run_at"]) == within


async def test_bulk_replay_and_preview_are_capped_at_1000(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine
) -> None:
    before = await row_counts(engine)
    assert_problem(await client.post("/v1/dead-letters/replay", json={"limit": 1001}, headers=auth), 422, "limit")
    assert await row_counts(engine) == before
    ok = await client.post("/v1/dead-letters/replay", json={"limit": 1000}, headers=auth)
    assert ok.status_code == 200 and ok.json()["replayed"] == []
    params: dict[str, str | int] = {"cron": "* * * * * *", "count": 1001}
    assert_problem(await client.get("/v1/schedules/preview", params=params, headers=auth), 422, "count")
    largest = await client.get("/v1/schedules/preview", params={**params, "count": 1000}, headers=auth)
    assert largest.status_code == 200 and len(largest.json()["fire_times"]) == 1000


async def test_readyz_is_503_while_the_schema_is_behind(settings: Settings, engine: AsyncEngine) -> None:
    app = create_app(settings, engine=engine)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
        assert (await http.get("/readyz")).status_code == 200
        async with engine.begin() as conn:
            # As if a newer release had not migrated this database yet: really one migration
            # behind (the last one downgraded).
            await conn.run_sync(downgrade_one)
            assert await conn.run_sync(revision_of) != head_revision()
        behind = await http.get("/readyz")
        assert behind.status_code == 503
        assert behind.json() == {
            "status": "unavailable",
            "database": True,
            "schema_current": False,
            "reason": "the database schema is not at the revision this version needs (run cronhook migrate)",
        }
        await migrate_to_head(engine)
        assert (await http.get("/readyz")).status_code == 200


def downgrade_one(connection: Connection) -> None:
    downgrade_to(connection, "-1")


def downgrade_to(connection: Connection, revision: str) -> None:
    """Alembic's downgrade on this connection: to `revision`, or by a relative step ("-1")."""
    config = alembic_config()
    config.attributes["connection"] = connection
    command.downgrade(config, revision)


async def every_page(client: httpx.AsyncClient, auth: dict[str, str], path: str, limit: int) -> list[list[str]]:
    """The ids on each page, following next_cursor to the end."""
    pages: list[list[str]] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": limit, **({"cursor": cursor} if cursor else {})}
        response = await client.get(path, params=params, headers=auth)
        assert response.status_code == 200, response.text
        body = response.json()
        pages.append([str(item["id"]) for item in body["items"]])
        cursor = body["next_cursor"]
        if cursor is None:
            return pages
        assert len(pages) < 100, "paging does not end"


async def test_paging_through_targets_runs_and_dead_letters_has_no_gaps_or_repeats(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine, settings: Settings
) -> None:
    created = [(await make_target(client, auth, "http://127.0.0.1:9/h"))["id"] for _ in range(7)]
    pages = await every_page(client, auth, "/v1/targets", 3)
    assert [len(p) for p in pages] == [3, 3, 1]
    listed = [i for p in pages for i in p]
    assert sorted(listed) == sorted(created) and len(set(listed)) == 7

    # Seven dead letters (a closed port, one attempt each) and a recurring job with many runs.
    dead = [(await make_job(client, auth, created[0], max_attempts=1))["id"] for _ in range(7)]
    recurring = await make_job(client, auth, created[0], every_s=60, misfire_policy="skip", misfire_grace_s=1)
    async with engine.begin() as conn:
        # Down for 10.5 minutes: eleven missed fire times, each a run.
        past = func.now() - dt.timedelta(seconds=630)
        await conn.execute(
            update(jobs)
            .where(jobs.c.id == uuid.UUID(recurring["id"]))
            .values(schedule_anchor_at=past, scheduled_for=past, run_at=past)
        )
    scheduler = Scheduler(engine, SchedulerConfig.from_settings(settings), TEST_KEY_RING)

    async def settled() -> bool:
        await scheduler.run_once()
        letters = (await client.get("/v1/dead-letters", headers=auth)).json()["items"]
        runs = (await client.get(f"/v1/jobs/{recurring['id']}/runs", headers=auth)).json()["items"]
        return len(letters) == 7 and len(runs) == 11

    try:
        await wait_for(settled, timeout=30, message="seven dead letters and eleven runs")
    finally:
        await scheduler.close(grace_s=5)
    letter_pages = await every_page(client, auth, "/v1/dead-letters", 3)
    assert [len(p) for p in letter_pages] == [3, 3, 1]
    letters = (await client.get("/v1/dead-letters", params={"limit": 200}, headers=auth)).json()["items"]
    assert [i for p in letter_pages for i in p] == [str(letter["id"]) for letter in letters]
    assert sorted(str(letter["job_id"]) for letter in letters) == sorted(dead)

    run_pages = await every_page(client, auth, f"/v1/jobs/{recurring['id']}/runs", 4)
    assert [len(p) for p in run_pages] == [4, 4, 3]
    all_runs = (await client.get(f"/v1/jobs/{recurring['id']}/runs", headers=auth)).json()["items"]
    assert [i for p in run_pages for i in p] == [str(run["id"]) for run in all_runs]


async def test_an_idempotency_key_is_scoped_to_its_endpoint(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine
) -> None:
    key = {"Idempotency-Key": "one-key-two-endpoints"}
    target = await client.post(
        "/v1/targets", json={"name": "t", "url": "http://127.0.0.1:9/h"}, headers={**auth, **key}
    )
    assert target.status_code == 201 and "idempotent-replayed" not in target.headers
    # The same key on another endpoint is another request: it creates a job, not a replay
    # of the target (nor a 422 for a different body).
    job = await client.post("/v1/jobs", json={"target_id": target.json()["id"], "delay_s": 60}, headers={**auth, **key})
    assert job.status_code == 201 and "idempotent-replayed" not in job.headers
    assert job.json()["id"] != target.json()["id"] and job.json()["target_id"] == target.json()["id"]
    # Within each endpoint the key still replays.
    again = await client.post(
        "/v1/jobs", json={"target_id": target.json()["id"], "delay_s": 60}, headers={**auth, **key}
    )
    assert again.headers["idempotent-replayed"] == "true" and again.json()["id"] == job.json()["id"]
    counts = await row_counts(engine)
    assert (counts["targets"], counts["jobs"], counts["idempotency_keys"]) == (1, 1, 2)
