"""Jobs: creation and reads for the API; claim, finish and reap for the background services.

Every statement that changes a job's state names the state it expects (and, for a running
job, its lease token). A statement that matches no row lost a race: the caller logs it and
moves on, never retries it blindly.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    DateTime,
    Double,
    Integer,
    Text,
    and_,
    case,
    cast,
    column,
    func,
    literal,
    or_,
    select,
    update,
    values,
)
from sqlalchemy.dialects.postgresql import UUID
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection

from app.domain.lifecycle import AttemptContext, NextStep
from app.domain.partition import partition_for
from app.domain.retry import RetryPolicy
from app.domain.schedule import CronSchedule, IntervalSchedule, OnceSchedule, Schedule
from app.domain.states import CANCELLABLE_STATES, CLAIMABLE_STATES, JobState
from app.store.dead_letters import dead_letter_insert_many
from app.store.runs import AttemptOutcome, run_insert_many
from app.store.tables import job_state, jobs, targets

_CLAIMABLE = [s.value for s in CLAIMABLE_STATES]


@dataclass(frozen=True)
class NewJob:
    tenant_id: uuid.UUID
    target_id: uuid.UUID
    name: str | None
    payload: Any
    priority: int
    schedule: Schedule
    first_fire_at: dt.datetime
    policy: RetryPolicy


@dataclass(frozen=True)
class ClaimedJob:
    """A job leased to one scheduler, with what it needs to deliver it."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    target_id: uuid.UUID
    payload: Any
    schedule: Schedule
    schedule_anchor_at: dt.datetime
    scheduled_for: dt.datetime
    occurrence_id: uuid.UUID
    attempt: int
    policy: RetryPolicy
    lease_token: uuid.UUID
    lease_owner: str
    claimed_at: dt.datetime  # the database's now() at claim time
    url: str
    headers: dict[str, str]
    timeout_s: float
    signing_secret: str
    # The target's statuses to retry, replacing the default set; None = default.
    retry_on_status: frozenset[int] | None = None

    def attempt_context(self) -> AttemptContext:
        return AttemptContext(self.schedule, self.scheduled_for, self.schedule_anchor_at, self.attempt, self.policy)


def schedule_columns(schedule: Schedule) -> dict[str, Any]:
    if isinstance(schedule, OnceSchedule):
        return {"schedule_kind": "once", "cron": None, "every_s": None, "timezone": "UTC"}
    if isinstance(schedule, CronSchedule):
        return {
            "schedule_kind": "cron",
            "cron": schedule.expression,
            "every_s": None,
            "timezone": schedule.timezone,
        }
    return {"schedule_kind": "interval", "cron": None, "every_s": schedule.every_s, "timezone": "UTC"}


def schedule_from_row(row: RowMapping) -> Schedule:
    kind = row["schedule_kind"]
    if kind == "cron":
        return CronSchedule(row["cron"], row["timezone"])
    if kind == "interval":
        return IntervalSchedule(row["every_s"])
    return OnceSchedule(row["scheduled_for"])


def policy_from_row(row: RowMapping) -> RetryPolicy:
    return RetryPolicy(row["max_attempts"], row["backoff_base_s"], row["backoff_max_s"], row["backoff_factor"])


async def db_now(conn: AsyncConnection) -> dt.datetime:
    value: dt.datetime | None = await conn.scalar(select(func.now()))
    assert value is not None
    return value


async def job_create(conn: AsyncConnection, new: NewJob) -> RowMapping:
    (row,) = await job_create_many(conn, [new])
    return row


async def job_create_many(conn: AsyncConnection, news: list[NewJob]) -> list[RowMapping]:
    """One multi-row INSERT; rows come back in the order of `news`."""
    if not news:
        return []
    values = [_new_job_values(new) for new in news]
    stmt = jobs.insert().values(values).returning(*jobs.c)
    by_id = {row["id"]: row for row in (await conn.execute(stmt)).mappings().all()}
    return [by_id[v["id"]] for v in values]


def _new_job_values(new: NewJob) -> dict[str, Any]:
    job_id = uuid.uuid4()
    return dict(
        id=job_id,
        partition=partition_for(job_id),
        tenant_id=new.tenant_id,
        target_id=new.target_id,
        name=new.name,
        payload=new.payload,
        priority=new.priority,
        state=JobState.SCHEDULED,
        **schedule_columns(new.schedule),
        schedule_anchor_at=new.first_fire_at,
        scheduled_for=new.first_fire_at,
        occurrence_id=uuid.uuid4(),
        run_at=new.first_fire_at,
        max_attempts=new.policy.max_attempts,
        backoff_base_s=new.policy.backoff_base_s,
        backoff_max_s=new.policy.backoff_max_s,
        backoff_factor=new.policy.backoff_factor,
    )


async def job_get(conn: AsyncConnection, tenant_id: uuid.UUID, job_id: uuid.UUID) -> RowMapping | None:
    stmt = select(jobs).where(jobs.c.id == job_id, jobs.c.tenant_id == tenant_id)
    return (await conn.execute(stmt)).mappings().one_or_none()


async def job_list(
    conn: AsyncConnection,
    tenant_id: uuid.UUID,
    limit: int,
    after: tuple[dt.datetime, uuid.UUID] | None,
    state: JobState | None = None,
    target_id: uuid.UUID | None = None,
) -> list[RowMapping]:
    stmt = select(jobs).where(jobs.c.tenant_id == tenant_id)
    if state is not None:
        stmt = stmt.where(jobs.c.state == state)
    if target_id is not None:
        stmt = stmt.where(jobs.c.target_id == target_id)
    if after is not None:
        created, ident = after
        stmt = stmt.where(or_(jobs.c.created_at < created, and_(jobs.c.created_at == created, jobs.c.id < ident)))
    stmt = stmt.order_by(jobs.c.created_at.desc(), jobs.c.id.desc()).limit(limit)
    return list((await conn.execute(stmt)).mappings().all())


async def job_cancel(conn: AsyncConnection, tenant_id: uuid.UUID, job_id: uuid.UUID) -> RowMapping | None:
    """Cancels a non-terminal job; None when it is already terminal (or absent)."""
    stmt = (
        update(jobs)
        .where(
            jobs.c.id == job_id,
            jobs.c.tenant_id == tenant_id,
            jobs.c.state.in_([s.value for s in CANCELLABLE_STATES]),
        )
        .values(
            state=JobState.CANCELLED,
            run_at=None,
            lease_owner=None,
            lease_token=None,
            lease_expires_at=None,
            updated_at=func.now(),
            finished_at=func.now(),
        )
        .returning(*jobs.c)
    )
    return (await conn.execute(stmt)).mappings().one_or_none()


async def job_claim_due(conn: AsyncConnection, owner: str, limit: int, lease_s: float) -> list[ClaimedJob]:
    """Leases up to `limit` due jobs to `owner`, oldest due first.

    SKIP LOCKED lets concurrent schedulers claim disjoint batches without waiting.
    """
    due = (
        select(jobs.c.id)
        .where(jobs.c.state.in_(_CLAIMABLE), jobs.c.run_at <= func.now())
        .order_by(jobs.c.run_at, jobs.c.priority.desc())
        .limit(limit)
        .with_for_update(skip_locked=True, of=jobs)
        .cte("due")
    )
    stmt = (
        update(jobs)
        .where(jobs.c.id == due.c.id, targets.c.id == jobs.c.target_id)
        .values(
            state=JobState.RUNNING,
            attempt=jobs.c.attempt + 1,
            lease_owner=owner,
            lease_token=func.gen_random_uuid(),
            lease_expires_at=func.now() + dt.timedelta(seconds=lease_s),
            run_at=None,
            updated_at=func.now(),
        )
        .returning(
            *jobs.c,
            targets.c.url,
            targets.c.headers,
            targets.c.timeout_s,
            targets.c.signing_secret,
            targets.c.retry_on_status,
            func.now().label("claimed_at"),
        )
    )
    rows = (await conn.execute(stmt)).mappings().all()
    return [_claimed_from_row(row) for row in rows]


def _claimed_from_row(row: RowMapping) -> ClaimedJob:
    return ClaimedJob(
        id=row["id"],
        tenant_id=row["tenant_id"],
        target_id=row["target_id"],
        payload=row["payload"],
        schedule=schedule_from_row(row),
        schedule_anchor_at=row["schedule_anchor_at"],
        scheduled_for=row["scheduled_for"],
        occurrence_id=row["occurrence_id"],
        attempt=row["attempt"],
        policy=policy_from_row(row),
        lease_token=row["lease_token"],
        lease_owner=row["lease_owner"],
        claimed_at=row["claimed_at"],
        url=row["url"],
        headers=dict(row["headers"] or {}),
        timeout_s=row["timeout_s"],
        signing_secret=row["signing_secret"],
        retry_on_status=None if row["retry_on_status"] is None else frozenset(row["retry_on_status"]),
    )


async def job_release_claim(conn: AsyncConnection, job: ClaimedJob) -> bool:
    """Hands an unstarted claim back (no POST was made): the attempt is not counted."""
    stmt = (
        update(jobs)
        .where(jobs.c.id == job.id, jobs.c.state == JobState.RUNNING, jobs.c.lease_token == job.lease_token)
        .values(
            state=case(
                (jobs.c.attempt > 1, cast(literal(JobState.RETRYING.value), job_state)),
                else_=cast(literal(JobState.SCHEDULED.value), job_state),
            ),
            attempt=jobs.c.attempt - 1,
            run_at=func.now(),
            lease_owner=None,
            lease_token=None,
            lease_expires_at=None,
            updated_at=func.now(),
        )
        .returning(jobs.c.id)
    )
    return (await conn.execute(stmt)).first() is not None


@dataclass(frozen=True)
class FinishedAttempt:
    job: ClaimedJob
    result: AttemptOutcome
    step: NextStep

    @property
    def lease(self) -> tuple[uuid.UUID, uuid.UUID]:
        return (self.job.id, self.job.lease_token)


def _outcome_row(item: FinishedAttempt) -> dict[str, Any]:
    step = item.step
    return {
        "id": item.job.id,
        "lease_token": item.job.lease_token,
        "new_state": step.state,
        "retry_delay_s": step.retry_delay_s,
        "next_at": step.next_occurrence_at,
        "new_occurrence_id": uuid.uuid4() if step.state == JobState.SCHEDULED else None,
        "status_code": item.result.status_code,
        "error": item.result.error,
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
    outcome = values(
        column("id", UUID(as_uuid=True)),
        column("lease_token", UUID(as_uuid=True)),
        column("new_state", job_state),
        column("retry_delay_s", Double),
        column("next_at", DateTime(timezone=True)),
        column("new_occurrence_id", UUID(as_uuid=True)),
        column("status_code", Integer),
        column("error", Text),
        name="outcome",
    ).data([tuple(_outcome_row(item).values()) for item in items])
    # A VALUES column that is NULL in every row is typed text by PostgreSQL: cast on use.
    retry_delay_s = cast(outcome.c.retry_delay_s, Double)
    next_at = cast(outcome.c.next_at, DateTime(timezone=True))
    new_occurrence_id = cast(outcome.c.new_occurrence_id, UUID(as_uuid=True))
    retrying = outcome.c.new_state == JobState.RETRYING
    scheduled = outcome.c.new_state == JobState.SCHEDULED
    stmt = (
        update(jobs)
        .where(
            jobs.c.id == outcome.c.id,
            jobs.c.state == JobState.RUNNING,
            jobs.c.lease_token == outcome.c.lease_token,
        )
        .values(
            state=outcome.c.new_state,
            lease_owner=None,
            lease_token=None,
            lease_expires_at=None,
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
        )
        .returning(jobs.c.id, outcome.c.lease_token)
    )
    # Matched by (id, token): a stale outcome for the same job in this batch is not "applied".
    applied_leases = {(row.id, row.lease_token) for row in await conn.execute(stmt)}
    done = [item for item in items if item.lease in applied_leases]

    if done:
        await run_insert_many(conn, [run_values(item.job, item.result) for item in done])
    letters = [dead_letter_values(item.job, item.result) for item in done if item.step.dead_letter]
    if letters:
        await dead_letter_insert_many(conn, letters)
    return applied_leases


def run_values(job: ClaimedJob, result: AttemptOutcome) -> dict[str, Any]:
    return {
        "job_id": job.id,
        "tenant_id": job.tenant_id,
        "occurrence_id": job.occurrence_id,
        "scheduled_for": job.scheduled_for,
        "attempt": job.attempt,
        "replica_id": job.lease_owner,
        "started_at": result.started_at,
        "status_code": result.status_code,
        "duration_ms": result.duration_ms,
        "outcome": result.outcome,
        "error": result.error,
    }


def dead_letter_values(job: ClaimedJob, result: AttemptOutcome) -> dict[str, Any]:
    return {
        "tenant_id": job.tenant_id,
        "job_id": job.id,
        "target_id": job.target_id,
        "occurrence_id": job.occurrence_id,
        "scheduled_for": job.scheduled_for,
        "payload": job.payload,
        "attempts": job.attempt,
        "last_status_code": result.status_code,
        "last_error": result.error,
    }


async def job_lock_expired_leases(conn: AsyncConnection, limit: int) -> list[ClaimedJob]:
    """Running jobs whose lease has expired, row-locked for this transaction.

    SKIP LOCKED: two reapers never hold the same job; the lease-token guard in
    job_finish_attempts makes a late scheduler's completion a no-op.
    """
    stmt = (
        select(
            *jobs.c,
            targets.c.url,
            targets.c.headers,
            targets.c.timeout_s,
            targets.c.signing_secret,
            targets.c.retry_on_status,
            func.now().label("claimed_at"),
        )
        .join(targets, targets.c.id == jobs.c.target_id)
        .where(jobs.c.state == JobState.RUNNING, jobs.c.lease_expires_at < func.now())
        .order_by(jobs.c.lease_expires_at)
        .limit(limit)
        .with_for_update(skip_locked=True, of=jobs)
    )
    rows = (await conn.execute(stmt)).mappings().all()
    return [_claimed_from_row(row) for row in rows]
