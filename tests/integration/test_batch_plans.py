"""A batch statement that finds its jobs by id reads those jobs, however many others are
running: recording 50 outcomes (or 50 asynchronous 202s) while 400 jobs are in flight touches
the 50 through the primary key. Before, PostgreSQL drove the outcomes' UPDATE with the partial
index of running jobs: it read every running job for each batch, and with ANALYZE's estimate
of one running job (taken while none was) unnested the whole batch again for each of them,
5 x the PostgreSQL time per delivery of the rest of the delivery path together.

The plan is read as the scheduler runs the statement (its generic plan, on a table analysed
while nothing was running) from auto_explain on the test's own connection."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.domain.job import AttemptOutcome, FinishedAttempt, OpenedAttempt, RunOutcome
from app.domain.lifecycle import after_attempt
from app.store.claims import job_claim_due
from app.store.completions import job_open_async_attempts
from app.store.outcomes import job_finish_attempts
from tests.conftest import TEST_KEY_RING
from tests.factories import make_jobs_bulk, make_tenant_and_target

RUNNING = 400
BATCH = 50


async def _running_jobs(engine: AsyncEngine) -> list[Any]:
    tenant, target = await make_tenant_and_target(engine, "http://127.0.0.1:9/")
    await make_jobs_bulk(engine, tenant, target, 2_000)
    async with engine.connect() as conn:
        await conn.execute(text("ANALYZE jobs"))  # nothing is running yet: the estimate says so
    claimed: list[Any] = []
    async with engine.begin() as conn:
        while len(claimed) < RUNNING:
            claimed += await job_claim_due(conn, TEST_KEY_RING, "replica", 100, 300)
    return claimed


async def _plans_of(conn: AsyncConnection, statement: Any) -> list[dict[str, Any]]:
    """The plans auto_explain reports for what `statement(conn)` runs on this connection, in
    the scheduler's plan mode; skips where the server refuses to load auto_explain."""
    try:
        await conn.execute(text("LOAD 'auto_explain'"))
    except DBAPIError as exc:
        pytest.skip(f"auto_explain cannot be loaded here: {exc.orig}")
    for setting in (
        "auto_explain.log_min_duration = 0",
        "auto_explain.log_analyze = on",
        "auto_explain.log_format = json",
        "client_min_messages = log",
        "plan_cache_mode = force_generic_plan",  # as the scheduler's sessions (app/db/engine.py)
    ):
        await conn.execute(text(f"SET LOCAL {setting}"))
    raw = (await conn.get_raw_connection()).driver_connection
    assert raw is not None
    messages: list[str] = []

    def listen(_: Any, message: Any) -> None:
        messages.append(message.message)

    raw.add_log_listener(listen)
    try:
        await statement(conn)
    finally:
        raw.remove_log_listener(listen)
    return [json.loads(m.split("plan:", 1)[1]) for m in messages if "plan:" in m]


def _rows_read_from_jobs(node: dict[str, Any]) -> int:
    """Rows every scan of the jobs table in this plan returned, over all its loops."""
    read = 0
    if node.get("Relation Name") == "jobs" and "Scan" in node["Node Type"]:
        read += node["Actual Rows"] * node["Actual Loops"]
    return read + sum(_rows_read_from_jobs(child) for child in node.get("Plans", []))


def _assert_reads_only_the_batch(plans: list[dict[str, Any]]) -> None:
    """The batch's UPDATE of jobs read no more rows of jobs than the batch has."""
    (plan,) = [p for p in plans if "UPDATE jobs" in p["Query Text"]]
    assert _rows_read_from_jobs(plan["Plan"]) <= BATCH, json.dumps(plan["Plan"], indent=1)[:4000]


async def test_recording_a_batch_of_outcomes_reads_its_jobs_not_every_running_one(engine: AsyncEngine) -> None:
    claimed = await _running_jobs(engine)
    success = AttemptOutcome(RunOutcome.SUCCESS, 200)
    items = [
        FinishedAttempt(job, success, after_attempt(job.attempt_context(), True, job.claimed_at, random.Random(1)))
        for job in claimed[:BATCH]
    ]
    applied: set[Any] = set()

    async def finish(conn: AsyncConnection) -> None:
        applied.update(await job_finish_attempts(conn, items))

    async with engine.begin() as conn:
        plans = await _plans_of(conn, finish)
    assert applied == {(job.id, job.lease_token) for job in claimed[:BATCH]}
    _assert_reads_only_the_batch(plans)


async def test_opening_a_batch_of_async_attempts_reads_its_jobs_not_every_running_one(engine: AsyncEngine) -> None:
    claimed = await _running_jobs(engine)
    batch = claimed[:BATCH]
    opened: list[Any] = []

    async def open_attempts(conn: AsyncConnection) -> None:
        accepted = [
            OpenedAttempt(job, AttemptOutcome(RunOutcome.SUCCESS, 202, started_at=job.claimed_at), "d" * 64)
            for job in batch
        ]
        opened.extend(await job_open_async_attempts(conn, accepted))

    async with engine.begin() as conn:
        plans = await _plans_of(conn, open_attempts)
    assert len(opened) == BATCH
    _assert_reads_only_the_batch(plans)
