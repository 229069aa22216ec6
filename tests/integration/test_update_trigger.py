"""Migration 0025: one statement trigger for updated jobs (the quota's deltas and the due
NOTIFY), appending one delta per tenant and statement, none when nothing crossed between
unfinished and finished; and the way back to 0024."""

from __future__ import annotations

import asyncio
import random
import uuid

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.db.migrate import migrate_to_head, revision_of
from app.domain.job import AttemptOutcome, FinishedAttempt, RunOutcome
from app.domain.lifecycle import after_attempt
from app.services.due_listener import DueListener
from app.store.claims import job_claim_due
from app.store.outcomes import job_finish_attempts
from app.store.quotas import tenant_count_active_jobs, tenant_count_active_jobs_exactly
from tests.conftest import TEST_KEY_RING, make_target, new_tenant
from tests.factories import make_jobs, make_tenant_and_target
from tests.integration.test_lean_job_writes import _catalogue, _pending_deltas
from tests.integration.test_limits_and_paging import downgrade_to
from tests.receiver import wait_for

# Finishes (cancels) the jobs named, or brings finished ones back to wait, in one statement.
_FLIP = text(
    "UPDATE jobs SET "
    "state = CASE WHEN state = 'cancelled' THEN 'scheduled' ELSE 'cancelled' END::job_state, "
    "run_at = CASE WHEN state = 'cancelled' THEN now() + interval '1 hour' END, "
    "finished_at = CASE WHEN state = 'cancelled' THEN NULL ELSE now() END "
    "WHERE id = ANY(:ids)"
)


async def _jobs_of_new_tenant(
    engine: AsyncEngine, client: httpx.AsyncClient, auth: dict[str, str], count: int
) -> tuple[uuid.UUID, list[uuid.UUID]]:
    """`count` jobs due in an hour, made by one batch; their tenant (counter folded) and ids."""
    target = await make_target(client, auth, "http://127.0.0.1:9/hook")
    batch = await client.post(
        "/v1/jobs/batch", headers=auth, json={"jobs": [{"target_id": target["id"], "delay_s": 3600}] * count}
    )
    assert batch.status_code in (200, 201), batch.text
    ids = [uuid.UUID(item["id"]) for item in batch.json()["items"]]
    async with engine.begin() as conn:
        tenant: uuid.UUID = await conn.scalar(text("SELECT tenant_id FROM jobs WHERE id = :id"), {"id": ids[0]})
        assert await tenant_count_active_jobs(conn, tenant) == count
    return tenant, ids


async def _counted(conn: AsyncConnection, tenant: uuid.UUID) -> int:
    counted = await tenant_count_active_jobs(conn, tenant)
    assert counted == await tenant_count_active_jobs_exactly(conn, tenant)
    return counted


async def test_an_update_appends_one_delta_per_tenant_and_none_when_nothing_crosses(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine
) -> None:
    tenant, ids = await _jobs_of_new_tenant(engine, client, auth, 6)
    other, other_ids = await _jobs_of_new_tenant(engine, client, await new_tenant(engine), 3)

    # Rows that stay unfinished (a claim, a reschedule, a priority change) append nothing.
    async with engine.begin() as conn:
        await conn.execute(text("UPDATE jobs SET priority = 7 WHERE tenant_id = :t"), {"t": tenant})
        assert await _pending_deltas(conn, tenant) == []

    # Four finished by one statement: one row, -4.
    async with engine.begin() as conn:
        await conn.execute(_FLIP, {"ids": ids[:4]})
        assert await _pending_deltas(conn, tenant) == [-4]
        assert await _counted(conn, tenant) == 2

    # One statement over two tenants, both ways: this tenant gets three back and loses one
    # (+2 net), the other loses two.
    async with engine.begin() as conn:
        await conn.execute(_FLIP, {"ids": [*ids[:3], ids[5], *other_ids[:2]]})
        assert await _pending_deltas(conn, tenant) == [2]
        assert await _pending_deltas(conn, other) == [-2]
        assert await _counted(conn, tenant) == 4
        assert await _counted(conn, other) == 1

    # Two back, two gone in one statement: no net change, no row.
    async with engine.begin() as conn:
        await conn.execute(_FLIP, {"ids": [ids[3], ids[5], ids[0], ids[1]]})
        assert await _pending_deltas(conn, tenant) == []
        assert await _counted(conn, tenant) == 4


async def test_an_outcome_batch_over_two_tenants_appends_one_delta_for_each(engine: AsyncEngine) -> None:
    """The scheduler's own statements: a claim crosses nothing, and one outcome batch (the
    group commit of app/services/recorder.py) appends each tenant's net change once."""
    first, first_target = await make_tenant_and_target(engine, "http://127.0.0.1:9/")
    second, second_target = await make_tenant_and_target(engine, "http://127.0.0.1:9/")
    await make_jobs(engine, first, first_target, 4)
    await make_jobs(engine, second, second_target, 3)
    async with engine.begin() as conn:
        assert await _counted(conn, first) == 4 and await _counted(conn, second) == 3
    async with engine.begin() as conn:
        claimed = await job_claim_due(conn, TEST_KEY_RING, "replica", 10, 30)
        assert len(claimed) == 7
        assert await _pending_deltas(conn, first) == await _pending_deltas(conn, second) == []

    rng = random.Random(1)
    items: list[FinishedAttempt] = []
    for job in claimed:
        # The second tenant's first job fails and waits for its retry: it stays unfinished.
        failing = job.tenant_id == second and not any(item.job.tenant_id == second for item in items)
        result = AttemptOutcome(RunOutcome.HTTP_ERROR, 500) if failing else AttemptOutcome(RunOutcome.SUCCESS, 200)
        items.append(
            FinishedAttempt(job, result, after_attempt(job.attempt_context(), not failing, job.claimed_at, rng))
        )
    async with engine.connect() as conn:
        await conn.execution_options(isolation_level="AUTOCOMMIT")  # as the recorder writes it
        assert len(await job_finish_attempts(conn, items)) == 7
    async with engine.begin() as conn:
        assert await _pending_deltas(conn, first) == [-4]
        assert await _pending_deltas(conn, second) == [-2]
        assert await _counted(conn, first) == 0 and await _counted(conn, second) == 1


async def test_an_update_that_leaves_a_job_due_within_the_minute_notifies_once(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine
) -> None:
    tenant, ids = await _jobs_of_new_tenant(engine, client, auth, 3)
    notices: list[float | None] = []
    connected: list[str | None] = []
    stop = asyncio.Event()
    # The partition callback hears None once the listener is connected.
    listening = asyncio.create_task(DueListener(engine, notices.append, on_partitions=connected.append).run(stop))
    try:
        await wait_for(lambda: None in connected, timeout=10, message="the listener connected")
        async with engine.begin() as conn:
            # Still an hour away: no notice.
            await conn.execute(
                text("UPDATE jobs SET run_at = run_at - interval '1 minute' WHERE id = :id"), {"id": ids[0]}
            )
            # Two left due within the minute by one statement (and one finished): one notice,
            # for the earlier.
            await conn.execute(
                text(
                    "UPDATE jobs SET run_at = now() + CASE WHEN id = :a THEN interval '5 seconds' "
                    "ELSE interval '9 seconds' END WHERE id IN (:a, :b)"
                ),
                {"a": ids[1], "b": ids[2]},
            )
            due_at = await conn.scalar(text("SELECT run_at FROM jobs WHERE id = :a"), {"a": ids[1]})
            await conn.execute(_FLIP, {"ids": [ids[0]]})
        await wait_for(lambda: len(notices) >= 1, timeout=10, message="a notice")
        await asyncio.sleep(0.5)  # a further notice would have arrived by now
        assert notices == [pytest.approx(due_at.timestamp(), abs=0.001)]
        async with engine.begin() as conn:
            assert await _pending_deltas(conn, tenant) == [-1]
    finally:
        stop.set()
        await asyncio.wait_for(listening, 10)


async def test_downgrade_restores_the_two_update_triggers_and_upgrade_replaces_them_again(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine
) -> None:
    tenant, ids = await _jobs_of_new_tenant(engine, client, auth, 3)
    async with engine.connect() as conn:
        checks, triggers = await _catalogue(conn)
    assert "jobs_updated" in triggers
    assert not {"jobs_live_crossed", "jobs_notify_due_update"} & triggers

    async with engine.begin() as conn:
        await conn.run_sync(downgrade_to, "0024")
        assert await conn.run_sync(revision_of) == "0024"
        restored = triggers - {"jobs_updated"} | {"jobs_live_crossed", "jobs_notify_due_update"}
        assert await _catalogue(conn) == (checks, restored)
    # The restored row trigger keeps to its WHEN: nothing for rows that stay unfinished...
    async with engine.begin() as conn:
        await conn.execute(text("UPDATE jobs SET priority = 7 WHERE tenant_id = :t"), {"t": tenant})
        assert await _pending_deltas(conn, tenant) == []
    # ...and counts a cancel made on 0024, a row per job.
    assert (await client.post(f"/v1/jobs/{ids[0]}/cancel", headers=auth)).status_code == 200
    async with engine.begin() as conn:
        await conn.execute(_FLIP, {"ids": ids[1:]})
        assert await _pending_deltas(conn, tenant) == [-1, -1, -1]
        assert await _counted(conn, tenant) == 0

    await migrate_to_head(engine)
    async with engine.connect() as conn:
        assert await _catalogue(conn) == (checks, triggers)
    async with engine.begin() as conn:
        await conn.execute(_FLIP, {"ids": ids})
        assert await _pending_deltas(conn, tenant) == [3]
        assert await _counted(conn, tenant) == 3
