"""Migration 0024: one statement trigger for inserted jobs (the quota's deltas and the due
NOTIFY), fewer CHECKs; and the way back to 0023."""

from __future__ import annotations

import uuid

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.db.migrate import migrate_to_head, revision_of
from app.store.quotas import tenant_count_active_jobs, tenant_count_active_jobs_exactly
from tests.conftest import make_job, make_target, new_tenant
from tests.integration.test_limits_and_paging import downgrade_to

_DROPPED = (
    "schedule_kind_valid",
    "interval_mode_valid",
    "misfire_policy_valid",
    "overlap_policy_valid",
    "completion_valid",
    "health_alert_valid",
    "misfire_bounds",
    "max_runs_positive",
    "jitter_range",
    "backoff_factor_at_least_one",
    "expect_positive",
    "progress_range",
)


async def _catalogue(conn: AsyncConnection) -> tuple[set[str], set[str]]:
    """The CHECK constraints and the (user) triggers on jobs, by name."""
    checks = await conn.scalars(
        text("SELECT conname FROM pg_constraint WHERE conrelid = 'jobs'::regclass AND contype = 'c'")
    )
    triggers = await conn.scalars(
        text("SELECT tgname FROM pg_trigger WHERE tgrelid = 'jobs'::regclass AND NOT tgisinternal")
    )
    return set(checks), set(triggers)


async def _pending_deltas(conn: AsyncConnection, tenant_id: uuid.UUID) -> list[int]:
    rows = await conn.scalars(text("SELECT delta FROM tenant_job_deltas WHERE tenant_id = :t"), {"t": tenant_id})
    return list(rows)


async def _tenant_of_key(engine: AsyncEngine, auth: dict[str, str], client: httpx.AsyncClient) -> uuid.UUID:
    target = await make_target(client, auth, "http://127.0.0.1:9/hook")
    job = await make_job(client, auth, target["id"], delay_s=3600)
    async with engine.connect() as conn:
        tenant: uuid.UUID = await conn.scalar(text("SELECT tenant_id FROM jobs WHERE id = :id"), {"id": job["id"]})
    return tenant


async def test_a_batch_appends_one_delta_and_one_statement_counts_each_tenant(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine
) -> None:
    tenant = await _tenant_of_key(engine, auth, client)
    async with engine.begin() as conn:
        assert await tenant_count_active_jobs(conn, tenant) == 1  # folds what is pending
        assert await _pending_deltas(conn, tenant) == []
    target = await make_target(client, auth, "http://127.0.0.1:9/other")
    batch = await client.post(
        "/v1/jobs/batch",
        headers=auth,
        json={"jobs": [{"target_id": target["id"], "delay_s": 3600} for _ in range(50)]},
    )
    assert batch.status_code in (200, 201), batch.text
    async with engine.begin() as conn:
        # The batch's 50 jobs are one row to fold, not 50.
        assert await _pending_deltas(conn, tenant) == [50]
        assert await tenant_count_active_jobs(conn, tenant) == 51

    # One INSERT of two tenants' jobs (live and finished): each tenant gets its live count.
    other_auth = await new_tenant(engine)
    other = await _tenant_of_key(engine, other_auth, client)
    async with engine.begin() as conn:
        assert await tenant_count_active_jobs(conn, other) == 1
        columns = await conn.scalar(
            text(
                "SELECT string_agg(quote_ident(column_name), ', ' ORDER BY ordinal_position) "
                "FROM information_schema.columns WHERE table_name = 'jobs' "
                "AND column_name NOT IN ('id', 'occurrence_id', 'state', 'run_at', 'finished_at')"
            )
        )
        await conn.execute(
            text(
                f"INSERT INTO jobs (id, occurrence_id, state, run_at, finished_at, {columns}) "
                f"SELECT gen_random_uuid(), gen_random_uuid(), s.state::job_state, "
                f"CASE WHEN s.state = 'scheduled' THEN now() + interval '1 hour' END, "
                f"CASE WHEN s.state = 'succeeded' THEN now() END, {columns} "
                "FROM (SELECT * FROM jobs WHERE tenant_id IN (:a, :b) AND schedule_kind = 'once') j, "
                "(VALUES ('scheduled'), ('scheduled'), ('succeeded')) s(state)"
            ),
            {"a": tenant, "b": other},
        )
    async with engine.begin() as conn:
        for tenant_id in (tenant, other):
            counted = await tenant_count_active_jobs(conn, tenant_id)
            assert counted == await tenant_count_active_jobs_exactly(conn, tenant_id)
        assert await tenant_count_active_jobs(conn, other) == 1 + 2
        assert await tenant_count_active_jobs(conn, tenant) == 51 + 51 * 2


async def test_downgrade_restores_the_checks_and_triggers_and_upgrade_removes_them_again(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine
) -> None:
    tenant = await _tenant_of_key(engine, auth, client)
    async with engine.connect() as conn:
        checks, triggers = await _catalogue(conn)
    assert not {f"ck_jobs_{name}" for name in _DROPPED} & checks
    assert {"ck_jobs_running_iff_leased", "ck_jobs_priority_range", "ck_jobs_partition_range"} <= checks
    assert "jobs_inserted" in triggers
    assert not {"jobs_live_inserted", "jobs_notify_due_insert"} & triggers

    async with engine.begin() as conn:
        await conn.run_sync(downgrade_to, "0024")
        triggers_0024 = (await _catalogue(conn))[1]
        await conn.run_sync(downgrade_to, "0023")
        assert await conn.run_sync(revision_of) == "0023"
        old_checks, old_triggers = await _catalogue(conn)
    assert old_checks == checks | {f"ck_jobs_{name}" for name in _DROPPED}
    assert old_triggers == triggers_0024 - {"jobs_inserted"} | {"jobs_live_inserted", "jobs_notify_due_insert"}
    # The restored row trigger counts a create made on 0023.
    target = await make_target(client, auth, "http://127.0.0.1:9/hook")
    await make_job(client, auth, target["id"], delay_s=3600)
    async with engine.begin() as conn:
        assert await tenant_count_active_jobs(conn, tenant) == 2
    # A restored CHECK refuses what it refused before.
    with pytest.raises(IntegrityError, match="ck_jobs_jitter_range"):
        async with engine.begin() as conn:
            await conn.execute(text("UPDATE jobs SET jitter_s = 7200 WHERE tenant_id = :t"), {"t": tenant})

    await migrate_to_head(engine)
    async with engine.connect() as conn:
        assert await _catalogue(conn) == (checks, triggers)
    await make_job(client, auth, target["id"], delay_s=3600)
    async with engine.begin() as conn:
        assert await tenant_count_active_jobs(conn, tenant) == 3 == await tenant_count_active_jobs_exactly(conn, tenant)
