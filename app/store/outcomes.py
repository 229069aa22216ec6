"""Jobs, recording attempts: the batched finish (group commit) that moves each job on under
its lease, and the run and dead-letter rows it writes.

The batch is one statement (the UPDATE and its run rows) guarded per row by state running
and the lease token; an attempt it does not match was fenced (reaped or cancelled
meanwhile) and writes nothing.
"""

from __future__ import annotations

import functools
import json
import uuid
from typing import Any

from sqlalchemy import DateTime, Double, Integer, Text, bindparam, case, cast, func, literal, select, text, update
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID, insert

from app.db.async_engine import AsyncConnection
from app.db.driver import DriverStatement, driver_fetch_all
from app.domain.chains import PARENT_RESULT, ChainOn, settled_as
from app.domain.fire_times import Skipped
from app.domain.job import AttemptOutcome, ClaimedJob, FinishedAttempt, RunOutcome
from app.domain.schedule import ScheduleKind, jittered
from app.domain.states import JobState
from app.store.dead_letters import dead_letter_insert_many
from app.store.job_rows import NO_LEASE
from app.store.outcome_events import SETTLED_COLUMNS, emit_occurrence_events, trip_auto_pauses
from app.store.runs import run_insert_many
from app.store.tables import job_state, jobs, runs, state_in_rows_by_id

_OUTCOME_COLUMNS: list[tuple[str, Any]] = [
    ("id", UUID(as_uuid=True)),
    ("lease_token", UUID(as_uuid=True)),
    ("new_state", Text),
    ("retry_delay_s", Double),
    ("next_at", DateTime(timezone=True)),
    # When the next occurrence fires: next_at, or its jitter after it.
    ("next_fire_at", DateTime(timezone=True)),
    ("new_occurrence_id", UUID(as_uuid=True)),
    ("status_code", Integer),
    ("error", Text),
    ("ended_reason", Text),
    # What the attempt's run row says besides the above (written in the same statement).
    ("tenant_id", UUID(as_uuid=True)),
    ("occurrence_id", UUID(as_uuid=True)),
    ("scheduled_for", DateTime(timezone=True)),
    # A jittered occurrence's fire time (NULL: scheduled_for).
    ("fire_at", DateTime(timezone=True)),
    ("attempt", Integer),
    ("replica_id", Text),
    ("started_at", DateTime(timezone=True)),
    ("duration_ms", Integer),
    ("outcome", Text),
    # How the attempt settled its occurrence for chained children (success, failure) or NULL.
    ("settled", Text),
]


def _outcome_row(item: FinishedAttempt) -> tuple[Any, ...]:
    step, job, result = item.step, item.job, item.result
    next_at = step.next_occurrence_at
    jitter_s = 0 if job.recurrence is None else job.recurrence.jitter_s
    return (
        job.id,
        job.lease_token,
        step.state.value,
        step.retry_delay_s,
        next_at,
        next_at if not jitter_s or next_at is None else jittered(job.id, next_at, jitter_s),
        uuid.uuid4() if step.state == JobState.SCHEDULED else None,
        result.status_code,
        result.error,
        step.ended_reason,
        job.tenant_id,
        job.occurrence_id,
        job.scheduled_for,
        job.fire_at,
        job.attempt,
        job.lease_owner,
        result.started_at,
        result.duration_ms,
        str(result.outcome),
        _settled(item),
    )


def _settled(item: FinishedAttempt) -> str | None:
    settled = settled_as(item.result.outcome == RunOutcome.SUCCESS, item.step.dead_letter)
    return None if settled is None else settled.value


# A receiver's report on an async attempt (app/api/routes/completions.py): its result, and
# that the receiver made it (reported_at), written with the run.
_REPORT_COLUMNS: list[tuple[str, Any]] = [("result", Text)]


def _finish_statement(reported: bool = False) -> DriverStatement:
    """The batch's UPDATE of jobs with the attempts' run rows as a data-modifying CTE: one
    statement, one round trip, built and compiled once (for the driver: app/db/driver.py).
    The batch travels as one typed array per column (bind parameters named after the
    columns), unnested into rows. `reported`: the variant for receivers' reports, whose runs
    also get a result and reported_at (the scheduler's batches never use it)."""
    return _built_finish_statement(bool(reported))


# Positional-only under functools.cache, which keys `f()` and `f(reported=False)` apart: with
# two keys, the warm-up compiled one object and each scheduler's first real batch another
# (~65 ms of its CPU among its first deliveries, which arrived 40-100 ms late).
@functools.cache
def _built_finish_statement(reported: bool, /) -> DriverStatement:
    columns = _OUTCOME_COLUMNS + (_REPORT_COLUMNS if reported else [])
    # Named apart from jobs' columns: a parameter named like a column would become a SET.
    arrays = [bindparam(f"outcome_{name}", type_=ARRAY(type_)) for name, type_ in columns]
    outcome = func.unnest(*arrays).table_valued(*(name for name, _ in columns)).render_derived(name="outcome")
    new_state = cast(outcome.c.new_state, job_state)
    retry_delay_s = cast(outcome.c.retry_delay_s, Double)
    next_at = cast(outcome.c.next_at, DateTime(timezone=True))
    next_fire_at = cast(outcome.c.next_fire_at, DateTime(timezone=True))
    new_occurrence_id = cast(outcome.c.new_occurrence_id, UUID(as_uuid=True))
    retrying = outcome.c.new_state == JobState.RETRYING.value
    scheduled = outcome.c.new_state == JobState.SCHEDULED.value
    applied = (
        update(jobs)
        .where(
            jobs.c.id == outcome.c.id,
            # A constant, as in the claim: PostgreSQL can keep one generic plan.
            state_in_rows_by_id([JobState.RUNNING]),
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
                (scheduled, next_fire_at),
                else_=None,
            ),
            scheduled_for=case((scheduled, next_at), else_=jobs.c.scheduled_for),
            occurrence_id=func.coalesce(new_occurrence_id, jobs.c.occurrence_id),
            attempt=case((scheduled, 0), else_=jobs.c.attempt),
            occurrences_run=jobs.c.occurrences_run + case((retrying, 0), else_=1),
            finished_at=case((retrying | scheduled, None), else_=func.now()),
            ended_reason=cast(outcome.c.ended_reason, Text),
            # Schedule health (app/domain/health.py): per settled occurrence, not per attempt.
            **_health_values(outcome.c.settled),
        )
        .returning(
            jobs.c.id,
            outcome.c.lease_token,
            jobs.c.parent_job_id,
            jobs.c.fires_children,
            # What the events about this attempt say (_emit_events, _trip_auto_pauses).
            jobs.c.tenant_id,
            jobs.c.target_id,
            jobs.c.partition,
            jobs.c.name,
            jobs.c.schedule_key,
            jobs.c.labels,
            jobs.c.on_success_target_id,
            jobs.c.on_failure_target_id,
            jobs.c.event_type,
            # The settled attempt's own values, from the batch row the UPDATE joined: the
            # event CTEs read them here rather than unnest the arrays again (each unnest of a
            # batch costs about as much as the run rows' INSERT).
            *(outcome.c[name].label(f"settled_{name}") for name in SETTLED_COLUMNS),
        )
        .cte("applied")
    )
    # The unnest is evaluated again for the runs (a second function scan of the same arrays,
    # cheaper than materializing it): only the attempts whose UPDATE matched get a run row.
    ran = outcome.alias("ran")
    run_columns = ["job_id", "tenant_id", "occurrence_id", "scheduled_for", "fire_at", "attempt", "replica_id"]
    run_columns += ["started_at", "status_code", "duration_ms", "outcome", "error", "lease_token"]
    reports = [cast(ran.c.result, JSONB), func.now()] if reported else []
    if reported:
        run_columns += ["result", "reported_at"]
    run_rows = select(
        ran.c.id,
        ran.c.tenant_id,
        ran.c.occurrence_id,
        ran.c.scheduled_for,
        ran.c.fire_at,
        ran.c.attempt,
        ran.c.replica_id,
        ran.c.started_at,
        ran.c.status_code,
        ran.c.duration_ms,
        ran.c.outcome,
        ran.c.error,
        # What a completion token names: a late report finds its attempt's run by it.
        ran.c.lease_token,
        *reports,
    ).join(applied, (applied.c.id == ran.c.id) & (applied.c.lease_token == ran.c.lease_token))
    written = insert(runs).from_select(run_columns, run_rows).cte("written")
    fired = _fire_children(applied, outcome.alias("settling"), reported).cte("fired")
    emitted = emit_occurrence_events(applied)
    tripped = trip_auto_pauses(applied)
    return DriverStatement(
        select(applied.c.id, applied.c.lease_token).add_cte(written).add_cte(fired).add_cte(emitted).add_cte(tripped)
    )


def _health_values(settled: Any) -> dict[str, Any]:
    """The job's health bookkeeping as its occurrence settles: a success ends a failure
    streak, a failure (dead-lettered) extends it; a pending retry changes neither."""
    succeeded, failed = settled == ChainOn.SUCCESS.value, settled == ChainOn.FAILURE.value
    return {
        "last_success_at": case((succeeded, func.now()), else_=jobs.c.last_success_at),
        "last_failure_at": case((failed, func.now()), else_=jobs.c.last_failure_at),
        "consecutive_failures": case(
            (succeeded, 0), (failed, jobs.c.consecutive_failures + 1), else_=jobs.c.consecutive_failures
        ),
    }


def _fire_children(applied: Any, settling: Any, reported: bool) -> Any:
    """The INSERT of one occurrence for each chained child of each occurrence settled here
    (app/domain/chains.py): a one-off due now whose parent is the chained job and whose cause
    is the settled occurrence, at most once per (chained job, cause). Only applied rows
    marked fires_children are joined with their children, so settling any other job does not
    probe the index of chained jobs."""
    child = jobs.alias("child")
    # The job whose occurrence settled: the row itself, or the job it carries an occurrence of.
    source = func.coalesce(applied.c.parent_job_id, applied.c.id)
    payload: Any = child.c.payload
    if reported:
        parent_result = cast(settling.c.result, JSONB)
        from_parent = (child.c.payload_from == PARENT_RESULT) & settling.c.result.is_not(None)
        payload = case((from_parent, parent_result), else_=child.c.payload)
    now = func.now()
    values: dict[str, Any] = {
        "id": func.gen_random_uuid(),
        # The chained job's partition: its occurrences are claimed where it lives.
        "partition": child.c.partition,
        "tenant_id": child.c.tenant_id,
        "target_id": child.c.target_id,
        "name": child.c.name,
        "payload": payload,
        "priority": child.c.priority,
        "state": cast(literal(JobState.SCHEDULED.value), job_state),
        "schedule_kind": literal(ScheduleKind.ONCE.value),
        "schedule_anchor_at": now,
        "scheduled_for": now,
        "run_at": now,
        "occurrence_id": func.gen_random_uuid(),
        "max_attempts": child.c.max_attempts,
        "backoff_base_s": child.c.backoff_base_s,
        "backoff_max_s": child.c.backoff_max_s,
        "backoff_factor": child.c.backoff_factor,
        "completion": child.c.completion,
        "async_timeout_s": child.c.async_timeout_s,
        "heartbeat_timeout_s": child.c.heartbeat_timeout_s,
        "parent_job_id": child.c.id,
        "cause_id": settling.c.occurrence_id,
        "fires_children": child.c.fires_children,
        "labels": child.c.labels,
        # The chained job's callbacks are its occurrences'.
        "on_success_target_id": child.c.on_success_target_id,
        "on_failure_target_id": child.c.on_failure_target_id,
    }
    follows = (child.c.after_on == ChainOn.ANY.value) | (child.c.after_on == settling.c.settled)
    rows = (
        select(*(value.label(name) for name, value in values.items()))
        .select_from(applied)
        .join(settling, (settling.c.id == applied.c.id) & (settling.c.lease_token == applied.c.lease_token))
        .join(child, (child.c.after_job_id == source) & (child.c.tenant_id == settling.c.tenant_id))
        .where(applied.c.fires_children, settling.c.settled.is_not(None), child.c.state == JobState.SCHEDULED, follows)
    )
    return (
        insert(jobs)
        .from_select(list(values), rows)
        .on_conflict_do_nothing(
            index_elements=[jobs.c.parent_job_id, jobs.c.cause_id], index_where=text("cause_id IS NOT NULL")
        )
    )


async def job_finish_warm_up(conn: AsyncConnection) -> None:
    """Runs the batch statement with an empty batch on `conn`: compiled for the driver, parsed
    and planned by this session, before the first outcome that counts. Compiled by the first
    batch instead, it cost each scheduler process ~65 ms of CPU in the middle of a burst."""
    await driver_fetch_all(conn, _finish_statement(), {f"outcome_{name}": [] for name, _ in _OUTCOME_COLUMNS})


def finish_is_one_statement(items: list[FinishedAttempt]) -> bool:
    """True when recording `items` writes nothing beyond the batch statement (no dead letter,
    no skipped-overlap run): the usual batch, which may then run in autocommit, without the
    BEGIN and COMMIT round trips. Any other batch needs a transaction."""
    return not any(item.step.dead_letter or item.step.overlapped.times for item in items)


async def job_finish_attempts(
    conn: AsyncConnection, items: list[FinishedAttempt], results: list[str | None] | None = None
) -> set[tuple[uuid.UUID, uuid.UUID]]:
    """Records attempts' outcomes and moves their jobs on, each guarded by its lease token.

    One statement for the whole batch (group commit): the UPDATE and the run rows of the
    jobs it matched; then, only when there are any, skipped-overlap runs and dead letters
    (in the caller's transaction: see finish_is_one_statement).
    Returns the (job id, lease token) pairs applied; an attempt missing from it was fenced
    (reaped or cancelled meanwhile): its outcome is not applied and no run is written for it.

    `results`: the attempts were reported by their receivers (async completion), one result
    (JSON text, or None) per item, kept on their runs with reported_at.
    """
    if not items:
        return set()
    if results is None:
        # One outcome per lease: the same claim handed over twice must not write two runs.
        items = list({item.lease: item for item in items}.values())
    elif len(results) != len(items):
        raise ValueError("one result per reported attempt")
    columns = list(zip(*(_outcome_row(item) for item in items), strict=True))
    params = {f"outcome_{name}": list(values) for (name, _), values in zip(_OUTCOME_COLUMNS, columns, strict=True)}
    if results is not None:
        params["outcome_result"] = results
    # Matched by (id, token): a stale outcome for the same job in this batch is not "applied".
    rows = await driver_fetch_all(conn, _finish_statement(reported=results is not None), params)
    applied_leases = {(row["id"], row["lease_token"]) for row in rows}
    done = [item for item in items if item.lease in applied_leases]

    skipped = []
    for item in done:
        skipped.extend(skipped_run_values(item.job, item.step.overlapped, RunOutcome.SKIPPED_OVERLAP, OVERLAP_REASON))
    if skipped:
        await run_insert_many(conn, skipped)
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
        # The row's JSON text as the claim read it, back to a value for the JSONB column.
        "payload": json.loads(job.payload_json),
        "attempts": job.attempt,
        "last_status_code": result.status_code,
        "last_error": result.error,
    }
