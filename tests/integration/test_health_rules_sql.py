"""The SQL of schedule health (app/store/health.py: the watch's verdict and the health a job
shows) held to the pure rules it writes again (app/domain/health.py: classify), row by row,
over a table of job records on a real PostgreSQL."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import httpx
from sqlalchemy import func, literal_column, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.schemas.health import health_facts_of_row
from app.domain.health import Health, HealthDefaults, HealthFacts, classify, thresholds
from app.services.health_watch import health_watch_once
from app.store import jobs as store
from app.store.quotas import tenant_limits_set
from app.store.tables import jobs, targets
from tests.conftest import make_job, make_target

DEFAULTS = HealthDefaults(max_consecutive_failures=2, success_within_s=None)
MINUTES: Any = literal_column("interval '1 minute'")
INFINITY: Any = literal_column("'infinity'::timestamptz")

# (recurring, the record set with SQL, on the paused target)
CASES: list[tuple[bool, dict[str, Any], bool]] = [
    (True, {}, False),
    (True, {"last_success_at": func.now()}, False),
    (True, {"consecutive_failures": 1, "last_failure_at": func.now()}, False),  # below the settings' 2
    (True, {"consecutive_failures": 2}, False),
    (True, {"consecutive_failures": 2, "expect_max_consecutive_failures": 3}, False),
    (True, {"expect_success_within_s": 600, "created_at": func.now() - 11 * MINUTES}, False),
    (True, {"expect_success_within_s": 600, "last_success_at": func.now() - 9 * MINUTES}, False),
    # The tenant's default deadline is 30 minutes.
    (True, {"created_at": func.now() - 31 * MINUTES}, False),
    (True, {"created_at": func.now() - 31 * MINUTES, "last_success_at": func.now() - 29 * MINUTES}, False),
    (False, {"created_at": func.now() - 31 * MINUTES}, False),
    (True, {"run_at": func.now() - 2 * MINUTES, "last_success_at": func.now()}, False),
    (True, {"run_at": func.now() - 2 * MINUTES, "consecutive_failures": 5}, False),
    (True, {"health_alert": "failing", "last_success_at": func.now()}, False),
    (True, {"health_alert": "failing", "consecutive_failures": 4}, False),
    (True, {"state": "paused", "run_at": None, "consecutive_failures": 4}, False),
    (True, {"state": "paused", "run_at": None, "health_alert": "failing", "last_success_at": func.now()}, False),
    (True, {"run_at": INFINITY, "held_run_at": func.now(), "consecutive_failures": 4}, False),
    (True, {"consecutive_failures": 4}, True),
    (True, {"run_at": func.now() - 2 * MINUTES}, True),
    (False, {"state": "dead", "run_at": None, "finished_at": func.now(), "consecutive_failures": 1}, False),
    (True, {"state": "cancelled", "run_at": None, "finished_at": func.now(), "health_alert": "failing"}, False),
    (True, {"state": "succeeded", "run_at": None, "finished_at": func.now(), "last_success_at": func.now()}, False),
    (False, {"state": "cancelled", "run_at": None, "finished_at": func.now()}, True),
]


def facts_of(row: Any, paused_target: uuid.UUID) -> HealthFacts:
    return health_facts_of_row(row, target_paused=row["target_id"] == paused_target)


async def test_the_sql_shows_what_the_rules_classify(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine
) -> None:
    target = await make_target(client, auth, "https://example.com/hook")
    paused = await make_target(client, auth, "https://example.com/paused")
    paused_id = uuid.UUID(paused["id"])
    ids = []
    for recurring, _, on_paused in CASES:
        schedule = {"every_s": 60} if recurring else {"delay_s": 3600}
        ids.append(uuid.UUID((await make_job(client, auth, (paused if on_paused else target)["id"], **schedule))["id"]))
    async with engine.begin() as conn:
        tenant_id = await conn.scalar(select(targets.c.tenant_id).where(targets.c.id == paused_id))
        assert isinstance(tenant_id, uuid.UUID)
        await tenant_limits_set(conn, tenant_id, {"expect_success_within_s": 1800})
        await conn.execute(
            update(targets).where(targets.c.id == paused_id).values(paused_at=func.now(), pause_kind="manual")
        )
        for job_id, (_, record, _) in zip(ids, CASES, strict=True):
            if record:
                await conn.execute(update(jobs).where(jobs.c.id == job_id).values(**record))
        rows = {job_id: await store.job_get(conn, tenant_id, job_id) for job_id in ids}
        now: dt.datetime = await store.db_now(conn)
    expected: dict[uuid.UUID, Any] = {}
    for job_id, row in rows.items():
        assert row is not None
        limits = thresholds(
            job=(row["expect_success_within_s"], row["expect_max_consecutive_failures"]),
            tenant=(1800, None),
            defaults=DEFAULTS,
            recurring=row["schedule_kind"] in ("cron", "interval"),
        )
        expected[job_id] = classify(facts_of(row, paused_id), limits, now)

    await health_watch_once(engine, DEFAULTS, 500)
    async with engine.connect() as conn:
        shown: dict[uuid.UUID, Any] = {}
        for job_id in ids:
            found = await store.job_get(conn, tenant_id, job_id)
            assert found is not None
            shown[job_id] = found["health"]
    table = [(CASES[i][1], shown[job_id], expected[job_id]) for i, job_id in enumerate(ids)]
    assert [(case, sql) for case, sql, rules in table if sql != rules] == []
    # The table reaches every word.
    assert set(expected.values()) == set(Health)
