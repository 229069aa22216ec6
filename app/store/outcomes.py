"""Jobs, recording attempts: the batched finish (group commit) that moves each job on under
its lease, and the run and dead-letter rows it writes.

The batch is one UPDATE guarded per row by state running and the lease token; an attempt
it does not match was fenced (reaped or cancelled meanwhile) and writes nothing.
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import DateTime, Double, Integer, Text, case, cast, func, literal, update
from sqlalchemy.dialects.postgresql import ARRAY, UUID
from sqlalchemy.ext.asyncio import AsyncConnection

from app.domain.fire_times import Skipped
from app.domain.job import AttemptOutcome, ClaimedJob, FinishedAttempt, RunOutcome
from app.domain.states import JobState
from app.store.dead_letters import dead_letter_insert_many
from app.store.job_rows import NO_LEASE
from app.store.runs import run_insert_many
from app.store.tables import job_state, jobs

_OUTCOME_COLUMNS: list[tuple[str, Any]] = [
    ("id", UUID(as_uuid=True)),
    ("lease_token", UUID(as_uuid=True)),
    ("new_state", Text),
    ("retry_delay_s", Double),
    ("next_at", DateTime(timezone=True)),
    ("new_occurrence_id", UUID(as_uuid=True)),
    ("status_code", Integer),
    ("error", Text),
    ("ended_reason", Text),
]


def _outcome_row(item: FinishedAttempt) -> dict[str, Any]:
    step = item.step
    return {
        "id": item.job.id,
        "lease_token": item.job.lease_token,
        "new_state": step.state.value,
        "retry_delay_s": step.retry_delay_s,
        "next_at": step.next_occurrence_at,
        "new_occurrence_id": uuid.uuid4() if step.state == JobState.SCHEDULED else None,
        "status_code": item.result.status_code,
        "error": item.result.error,
        "ended_reason": step.ended_reason,
    }


async def job_finish_attempts(conn: AsyncConnection, items: list[FinishedAttempt]) -> set[tuple[uuid.UUID, uuid.UUID]]:
    """Records attempts' outcomes and moves their jobs on, each guarded by its lease token.

    One UPDATE for the whole batch (group commit), then the runs and dead letters of the
    jobs it matched. Returns the (job id, lease token) pairs applied; an attempt missing
    from it was fenced (reaped or cancelled meanwhile): its outcome is not applied and no
    run is written for it here.
    """
    if not items:
        return set()
    # One outcome per lease: the same claim handed over twice must not write two runs.
    items = list({item.lease: item for item in items}.values())
    # The batch travels as one typed array per column, unnested into rows: the statement is
    # the same for every batch size, so it is compiled once and cached (a VALUES list with
    # literal rows would be compiled anew for every batch).
    rows = [_outcome_row(item) for item in items]
    arrays = [literal([row[name] for row in rows], ARRAY(type_)) for name, type_ in _OUTCOME_COLUMNS]
    outcome = func.unnest(*arrays).table_valued(*(name for name, _ in _OUTCOME_COLUMNS)).render_derived(name="outcome")
    new_state = cast(outcome.c.new_state, job_state)
    retry_delay_s = cast(outcome.c.retry_delay_s, Double)
    next_at = cast(outcome.c.next_at, DateTime(timezone=True))
    new_occurrence_id = cast(outcome.c.new_occurrence_id, UUID(as_uuid=True))
    retrying = outcome.c.new_state == JobState.RETRYING.value
    scheduled = outcome.c.new_state == JobState.SCHEDULED.value
    stmt = (
        update(jobs)
        .where(
            jobs.c.id == outcome.c.id,
            jobs.c.state == JobState.RUNNING,
            jobs.c.lease_token == outcome.c.lease_token,
        )
        .values(
            state=new_state,
            **NO_LEASE,
            last_status_code=cast(outcome.c.status_code, Integer),
            last_error=cast(outcome.c.error, Text),
            updated_at=func.now(),
            # Retries count from the database's clock; the next occurrence is absolute.
            run_at=case(
                (retrying, func.now() + func.make_interval(0, 0, 0, 0, 0, 0, retry_delay_s)),
                (scheduled, next_at),
                else_=None,
            ),
            scheduled_for=case((scheduled, next_at), else_=jobs.c.scheduled_for),
            occurrence_id=func.coalesce(new_occurrence_id, jobs.c.occurrence_id),
            attempt=case((scheduled, 0), else_=jobs.c.attempt),
            occurrences_run=jobs.c.occurrences_run + case((retrying, 0), else_=1),
            finished_at=case((retrying | scheduled, None), else_=func.now()),
            ended_reason=cast(outcome.c.ended_reason, Text),
        )
        .returning(jobs.c.id, outcome.c.lease_token)
    )
    # Matched by (id, token): a stale outcome for the same job in this batch is not "applied".
    applied_leases = {(row.id, row.lease_token) for row in await conn.execute(stmt)}
    done = [item for item in items if item.lease in applied_leases]

    if done:
        rows = [run_values(item.job, item.result) for item in done]
        for item in done:
            rows.extend(skipped_run_values(item.job, item.step.overlapped, RunOutcome.SKIPPED_OVERLAP, OVERLAP_REASON))
        await run_insert_many(conn, rows)
    letters = [dead_letter_values(item.job, item.result) for item in done if item.step.dead_letter]
    if letters:
        await dead_letter_insert_many(conn, letters)
    return applied_leases


def _occurrence_values(job: ClaimedJob) -> dict[str, Any]:
    """What a run and a dead letter say of the occurrence they belong to."""
    return {
        "job_id": job.id,
        "tenant_id": job.tenant_id,
        "occurrence_id": job.occurrence_id,
        "scheduled_for": job.scheduled_for,
    }


def run_values(job: ClaimedJob, result: AttemptOutcome) -> dict[str, Any]:
    return {
        **_occurrence_values(job),
        "attempt": job.attempt,
        "replica_id": job.lease_owner,
        "started_at": result.started_at,
        "status_code": result.status_code,
        "duration_ms": result.duration_ms,
        "outcome": result.outcome,
        "error": result.error,
    }


OVERLAP_REASON = "came due while the previous occurrence was still in flight (overlap_policy forbid)"
MISSED_REASON = "more than misfire_grace_s late; given up by the misfire policy"


def skipped_run_values(job: ClaimedJob, skipped: Skipped, outcome: RunOutcome, reason: str) -> list[dict[str, Any]]:
    """One run per skipped fire time (up to MAX_RECORDED_SKIPS); the last says how many in all."""
    rows = []
    for index, fire_time in enumerate(skipped.times):
        error = reason
        if index == len(skipped.times) - 1 and skipped.total > len(skipped.times):
            more = "at least " if skipped.truncated else ""
            error = f"{reason}; {more}{skipped.total} fire times skipped in all, the first {len(skipped.times)} listed"
        # Never delivered, so attempt 0 and an occurrence id no webhook ever carried.
        never_run = {"scheduled_for": fire_time, "attempt": 0, "occurrence_id": uuid.uuid4()}
        rows.append({**run_values(job, AttemptOutcome(outcome, error=error)), **never_run})
    return rows


def dead_letter_values(job: ClaimedJob, result: AttemptOutcome) -> dict[str, Any]:
    return {
        **_occurrence_values(job),
        "target_id": job.target_id,
        "payload": job.payload,
        "attempts": job.attempt,
        "last_status_code": result.status_code,
        "last_error": result.error,
    }
