"""Jobs: creation and reads for the API; claim, finish and reap for the background services.

Every statement that changes a job's state names the state it expects (and, for a running
job, its lease token). A statement that matches no row lost a race: the caller logs it and
moves on, never retries it blindly.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    DateTime,
    Double,
    Integer,
    SmallInteger,
    Text,
    and_,
    case,
    cast,
    func,
    literal,
    or_,
    select,
    text,
    tuple_,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, UUID, insert
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection

from app.domain.lifecycle import AttemptContext, NextStep
from app.domain.occurrences import (
    Bounds,
    EndReason,
    IntervalMode,
    MisfirePolicy,
    OverlapPolicy,
    Recurrence,
    Skipped,
)
from app.domain.partition import partition_for
from app.domain.priority import DEFAULT_PRIORITY_AGING_S, MAX_PRIORITY, MIN_PRIORITY
from app.domain.retry import RetryPolicy
from app.domain.schedule import CronSchedule, IntervalSchedule, OnceSchedule, Schedule
from app.domain.states import CANCELLABLE_STATES, CLAIMABLE_STATES, PAUSABLE_STATES, TERMINAL_STATES, JobState
from app.logs import log_event
from app.store.dead_letters import dead_letter_insert_many
from app.store.runs import AttemptOutcome, run_insert_many
from app.store.tables import DEDUP_KEY_LIVE, job_state, jobs, partition_leases, targets
from app.store.targets import target_saturated_ids, target_take_delivery_slots

logger = logging.getLogger(__name__)

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
    dedup_key: str | None = None
    # Recurring jobs: policies and bounds (its anchor is `schedule_anchor_at` below).
    recurrence: Recurrence | None = None
    anchor_at: dt.datetime | None = None  # default: first_fire_at
    parent_job_id: uuid.UUID | None = None  # a one-off carrying an occurrence of this job


@dataclass(frozen=True)
class ClaimedJob:
    """A job leased to one scheduler, with what it needs to deliver it."""

    id: uuid.UUID
    partition: int
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
    # The database's now() when this occurrence's first attempt was claimed (None on rows
    # claimed before migration 0005).
    occurrence_claimed_at: dt.datetime | None
    url: str
    headers: dict[str, str]
    timeout_s: float
    signing_secret: str
    # The target's statuses to retry, replacing the default set; None = default.
    retry_on_status: frozenset[int] | None = None
    # Recurring jobs: bounds and policies (None for one-offs), and occurrences delivered so far.
    recurrence: Recurrence | None = None
    occurrences_run: int = 0

    def attempt_context(self) -> AttemptContext:
        return AttemptContext(
            self.schedule,
            self.scheduled_for,
            self.schedule_anchor_at,
            self.attempt,
            self.policy,
            recurrence=self.recurrence,
            runs_done=self.occurrences_run,
            first_claimed_at=self.occurrence_claimed_at,
        )


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


def recurrence_from_row(row: RowMapping) -> Recurrence | None:
    schedule = schedule_from_row(row)
    if isinstance(schedule, OnceSchedule):
        return None
    return Recurrence(
        schedule=schedule,
        anchor=row["schedule_anchor_at"],
        interval_mode=IntervalMode(row["interval_mode"]),
        misfire_policy=MisfirePolicy(row["misfire_policy"]),
        misfire_grace_s=row["misfire_grace_s"],
        catch_up_limit=row["catch_up_limit"],
        overlap_policy=OverlapPolicy(row["overlap_policy"]),
        bounds=Bounds(
            _bound(row["start_at"], dt.datetime.min), _bound(row["end_at"], dt.datetime.max), row["max_runs"]
        ),
    )


def _bound(value: dt.datetime | None, unbounded: dt.datetime) -> dt.datetime | None:
    # asyncpg reads PostgreSQL's -infinity / infinity as a naive datetime.min / datetime.max
    # (rows written before bounds were range-checked); in the open direction that is no bound.
    return None if value == unbounded else value


def recurrence_columns(recurrence: Recurrence | None) -> dict[str, Any]:
    if recurrence is None:
        return {}
    return {
        "interval_mode": recurrence.interval_mode.value,
        "misfire_policy": recurrence.misfire_policy.value,
        "misfire_grace_s": recurrence.misfire_grace_s,
        "catch_up_limit": recurrence.catch_up_limit,
        "overlap_policy": recurrence.overlap_policy.value,
        "start_at": recurrence.bounds.start_at,
        "end_at": recurrence.bounds.end_at,
        "max_runs": recurrence.bounds.max_runs,
    }


def policy_from_row(row: RowMapping) -> RetryPolicy:
    return RetryPolicy(row["max_attempts"], row["backoff_base_s"], row["backoff_max_s"], row["backoff_factor"])


async def db_now(conn: AsyncConnection) -> dt.datetime:
    value: dt.datetime | None = await conn.scalar(select(func.now()))
    assert value is not None
    return value


async def job_create(conn: AsyncConnection, new: NewJob) -> RowMapping:
    (row,) = await job_create_many(conn, [new])
    return row


async def job_create_unless_duplicate(conn: AsyncConnection, new: NewJob) -> tuple[RowMapping | None, uuid.UUID | None]:
    """Creates the job unless an unfinished job of the tenant holds its `dedup_key`.

    Returns (new row, None), or (None, id of the job holding the key). ON CONFLICT against
    the partial unique index waits for a concurrent insert of the same key to commit, so
    exactly one of two racing creates wins.
    """
    assert new.dedup_key is not None
    stmt = (
        insert(jobs)
        .values(_new_job_values(new))
        .on_conflict_do_nothing(
            index_elements=[jobs.c.tenant_id, jobs.c.dedup_key],
            index_where=text(DEDUP_KEY_LIVE),
        )
        .returning(*jobs.c)
    )
    row = (await conn.execute(stmt)).mappings().one_or_none()
    if row is not None:
        return row, None
    holder = await conn.scalar(
        select(jobs.c.id).where(
            jobs.c.tenant_id == new.tenant_id,
            jobs.c.dedup_key == new.dedup_key,
            jobs.c.state.not_in([s.value for s in TERMINAL_STATES]),
        )
    )
    assert holder is not None, "the conflicting job is unfinished and committed"
    return None, holder


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
        schedule_anchor_at=new.anchor_at or new.first_fire_at,
        scheduled_for=new.first_fire_at,
        occurrence_id=uuid.uuid4(),
        run_at=new.first_fire_at,
        max_attempts=new.policy.max_attempts,
        backoff_base_s=new.policy.backoff_base_s,
        backoff_max_s=new.policy.backoff_max_s,
        backoff_factor=new.policy.backoff_factor,
        dedup_key=new.dedup_key,
        parent_job_id=new.parent_job_id,
        **recurrence_columns(new.recurrence),
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
    parent_job_id: uuid.UUID | None = None,
) -> list[RowMapping]:
    stmt = select(jobs).where(jobs.c.tenant_id == tenant_id)
    if state is not None:
        stmt = stmt.where(jobs.c.state == state)
    if target_id is not None:
        stmt = stmt.where(jobs.c.target_id == target_id)
    if parent_job_id is not None:
        stmt = stmt.where(jobs.c.parent_job_id == parent_job_id)
    if after is not None:
        created, ident = after
        stmt = stmt.where(or_(jobs.c.created_at < created, and_(jobs.c.created_at == created, jobs.c.id < ident)))
    stmt = stmt.order_by(jobs.c.created_at.desc(), jobs.c.id.desc()).limit(limit)
    return list((await conn.execute(stmt)).mappings().all())


def _leased(job_id: uuid.UUID, lease_token: uuid.UUID) -> list[ColumnElement[bool]]:
    """The guard of every write on behalf of a claim: the job is still running under that lease."""
    return [jobs.c.id == job_id, jobs.c.state == JobState.RUNNING, jobs.c.lease_token == lease_token]


# The lease columns of a job no scheduler holds.
_NO_LEASE: dict[str, Any] = {"lease_owner": None, "lease_token": None, "lease_expires_at": None}


async def _job_transition(
    conn: AsyncConnection,
    tenant_id: uuid.UUID,
    job_id: uuid.UUID,
    from_states: tuple[JobState, ...],
    values: dict[str, Any],
) -> RowMapping | None:
    """A user's state change, applied only from `from_states`; None when the job is in
    another state (or absent)."""
    stmt = (
        update(jobs)
        .where(jobs.c.id == job_id, jobs.c.tenant_id == tenant_id, jobs.c.state.in_([s.value for s in from_states]))
        .values(**values, updated_at=func.now())
        .returning(*jobs.c)
    )
    return (await conn.execute(stmt)).mappings().one_or_none()


async def job_cancel(conn: AsyncConnection, tenant_id: uuid.UUID, job_id: uuid.UUID) -> RowMapping | None:
    """Cancels a non-terminal job; None when it is already terminal (or absent)."""
    values = {"state": JobState.CANCELLED, "run_at": None, "finished_at": func.now(), **_NO_LEASE}
    return await _job_transition(conn, tenant_id, job_id, CANCELLABLE_STATES, values)


async def job_lock(conn: AsyncConnection, tenant_id: uuid.UUID, job_id: uuid.UUID) -> RowMapping | None:
    """The job, row-locked for this transaction (a change computed from it stays valid)."""
    stmt = select(jobs).where(jobs.c.id == job_id, jobs.c.tenant_id == tenant_id).with_for_update()
    return (await conn.execute(stmt)).mappings().one_or_none()


async def job_pause(conn: AsyncConnection, tenant_id: uuid.UUID, job_id: uuid.UUID) -> RowMapping | None:
    """Stops a waiting job from being claimed; None when it is not pausable (or absent)."""
    return await _job_transition(conn, tenant_id, job_id, PAUSABLE_STATES, {"state": JobState.PAUSED, "run_at": None})


async def job_resume(conn: AsyncConnection, tenant_id: uuid.UUID, job_id: uuid.UUID) -> RowMapping | None:
    """Makes a paused job claimable again; None when it is not paused (or absent).

    The current occurrence keeps its nominal time: if that passed during the pause, the job is
    due at once and the scheduler settles the missed fire times by the job's misfire policy.
    A paused retry resumes as a retry, due now.
    """
    retrying = jobs.c.attempt > 0
    values = {
        "state": case(
            (retrying, cast(literal(JobState.RETRYING.value), job_state)),
            else_=cast(literal(JobState.SCHEDULED.value), job_state),
        ),
        "run_at": case((retrying, func.now()), else_=jobs.c.scheduled_for),
    }
    return await _job_transition(conn, tenant_id, job_id, (JobState.PAUSED,), values)


async def job_update(
    conn: AsyncConnection, job_id: uuid.UUID, expected: JobState, changes: dict[str, Any]
) -> RowMapping | None:
    """Applies `changes` (column -> value) if the job is still in state `expected`."""
    stmt = (
        update(jobs)
        .where(jobs.c.id == job_id, jobs.c.state == expected)
        .values(**changes, updated_at=func.now())
        .returning(*jobs.c)
    )
    return (await conn.execute(stmt)).mappings().one_or_none()


async def job_claim_due(
    conn: AsyncConnection,
    owner: str,
    limit: int,
    lease_s: float,
    held: dict[int, int] | None = None,
    aging_s: float = DEFAULT_PRIORITY_AGING_S,
) -> list[ClaimedJob]:
    """Leases up to `limit` due jobs to `owner`, highest effective priority first (priority
    plus one level per `aging_s` waited), then oldest due first.

    `held` (partition -> epoch) fences the claim by ownership: only jobs in partitions whose
    lease row still names `owner` with that epoch, unexpired, are taken. None claims from
    every partition (tools and tests that run without ownership). SKIP LOCKED lets
    concurrent schedulers claim disjoint batches without waiting.
    """
    if held is not None and not held:
        return []
    # Shared by the ten level scans below, so each is computed once per claim.
    saturated = target_saturated_ids().cte("saturated")
    conditions = [
        jobs.c.state.in_(_CLAIMABLE),
        jobs.c.run_at <= func.now(),
        # A target at its limit does not crowd the batch: its jobs wait, others go ahead.
        jobs.c.target_id.not_in(select(saturated.c.id)),
    ]
    if held is not None:
        # The held (partition, epoch) pairs travel as two array parameters, not 512 scalars.
        pairs = (
            func.unnest(literal(list(held), ARRAY(SmallInteger)), literal(list(held.values()), ARRAY(BigInteger)))
            .table_valued("partition", "epoch")
            .render_derived(name="held")
        )
        owned = (
            select(partition_leases.c.partition)
            .where(
                partition_leases.c.owner == owner,
                partition_leases.c.expires_at > func.now(),
                tuple_(partition_leases.c.partition, partition_leases.c.epoch).in_(
                    select(pairs.c.partition, pairs.c.epoch)
                ),
            )
            .cte("owned")
        )
        conditions.append(jobs.c.partition.in_(select(owned.c.partition)))
    # Priority with aging (app/domain/priority.py): within one priority level, the longest
    # waiting job has the highest effective priority, so the `limit` best jobs overall are
    # among the `limit` oldest due jobs of each level. Ten short index scans (ix_jobs_due:
    # priority, run_at) find and lock those candidates, however large the backlog; SKIP
    # LOCKED in each keeps concurrent claimers on disjoint candidates. Candidates not taken
    # stay locked only until this transaction ends.
    levels = [
        select(jobs.c.id, jobs.c.target_id, jobs.c.priority, jobs.c.run_at)
        .where(*conditions, jobs.c.priority == level)
        .order_by(jobs.c.run_at)
        .limit(limit)
        .with_for_update(skip_locked=True, of=jobs)
        .cte(f"level_{level}")
        for level in range(MIN_PRIORITY, MAX_PRIORITY + 1)
    ]
    candidates = union_all(*(select(level) for level in levels)).subquery("candidates")
    waited_s = func.extract("epoch", func.now() - candidates.c.run_at)
    effective = candidates.c.priority + func.greatest(waited_s, 0) / aging_s
    limited = targets.c.max_in_flight.is_not(None) | targets.c.rate_per_s.is_not(None)
    due_stmt = (
        select(candidates.c.id, candidates.c.target_id, limited.label("limited"))
        .join(targets, targets.c.id == candidates.c.target_id)
        .order_by(effective.desc(), candidates.c.run_at)
        .limit(limit)
    )
    # Row-locked until commit: no other claimer can take these meanwhile.
    due = list(await conn.execute(due_stmt))
    if not due:
        return []
    ids = [row.id for row in due]
    limited_rows = [row for row in due if row.limited]
    if limited_rows:
        wanted = Counter(row.target_id for row in limited_rows)
        granted = await target_take_delivery_slots(conn, wanted)
        ids = []
        for row in due:  # in claim order: each limited target keeps its best jobs
            if row.limited:
                if granted[row.target_id] <= 0:
                    continue
                granted[row.target_id] -= 1
            ids.append(row.id)
        if not ids:
            return []
    stmt = (
        update(jobs)
        .where(jobs.c.id.in_(ids), targets.c.id == jobs.c.target_id)
        .values(
            state=JobState.RUNNING,
            attempt=jobs.c.attempt + 1,
            # Kept across the occurrence's retries (attempt is 0 only before its first claim).
            occurrence_claimed_at=case((jobs.c.attempt == 0, func.now()), else_=jobs.c.occurrence_claimed_at),
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
    claimed: list[ClaimedJob] = []
    for leased in rows:
        try:
            claimed.append(_claimed_from_row(leased))
        except Exception as exc:  # one row that cannot be loaded must not stop every delivery
            await _job_quarantine(conn, leased["id"], leased["lease_token"], f"{type(exc).__name__}: {exc}"[:300])
    return claimed


async def _job_quarantine(conn: AsyncConnection, job_id: uuid.UUID, lease_token: uuid.UUID, error: str) -> None:
    """Pauses a claimed job whose row could not be turned into a delivery (data the code no
    longer accepts), with the reason in last_error, so that a user can PATCH and resume it."""
    reason = f"paused: cronhook could not load this job ({error}); fix it with PATCH, then resume"
    await conn.execute(
        update(jobs)
        .where(*_leased(job_id, lease_token))
        .values(
            state=JobState.PAUSED,
            attempt=jobs.c.attempt - 1,
            run_at=None,
            **_NO_LEASE,
            last_error=reason,
            updated_at=func.now(),
        )
    )
    log_event(logger, "job_quarantined", logging.ERROR, job_id=str(job_id), error=error.split(":")[0])


def _claimed_from_row(row: RowMapping) -> ClaimedJob:
    return ClaimedJob(
        id=row["id"],
        partition=row["partition"],
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
        occurrence_claimed_at=row["occurrence_claimed_at"],
        url=row["url"],
        headers=dict(row["headers"] or {}),
        timeout_s=row["timeout_s"],
        signing_secret=row["signing_secret"],
        retry_on_status=None if row["retry_on_status"] is None else frozenset(row["retry_on_status"]),
        recurrence=recurrence_from_row(row),
        occurrences_run=row["occurrences_run"],
    )


async def job_release_claim(conn: AsyncConnection, job: ClaimedJob) -> bool:
    """Hands an unstarted claim back (no POST was made): the attempt is not counted."""
    stmt = (
        update(jobs)
        .where(*_leased(job.id, job.lease_token))
        .values(
            state=case(
                (jobs.c.attempt > 1, cast(literal(JobState.RETRYING.value), job_state)),
                else_=cast(literal(JobState.SCHEDULED.value), job_state),
            ),
            attempt=jobs.c.attempt - 1,
            run_at=func.now(),
            **_NO_LEASE,
            updated_at=func.now(),
        )
        .returning(jobs.c.id)
    )
    return (await conn.execute(stmt)).first() is not None


async def job_hand_off_occurrence(
    conn: AsyncConnection, job: ClaimedJob, next_at: dt.datetime | None, ended: EndReason | None
) -> ClaimedJob | None:
    """Moves a claimed recurring job's occurrence to a one-off child job, so the next
    occurrence can start while this one is in flight (overlap_policy allow).

    The child takes over the claim as it is (running, the same lease token, expiry, attempt
    and webhook-id), so the delivery, its retries and its dead letter are the child's, and a
    target's in-flight count does not change. The parent counts the occurrence as run and
    waits for `next_at`, or ends (succeeded, `ended`) when there is none. Guarded by the
    parent's lease token: returns the child to deliver, or None when the lease was lost.
    """
    child_id = uuid.uuid4()
    guard = _leased(job.id, job.lease_token)
    copied = ["tenant_id", "target_id", "name", "payload", "priority", "state", "occurrence_id", "attempt"]
    copied += ["occurrence_claimed_at", "max_attempts", "backoff_base_s", "backoff_max_s", "backoff_factor"]
    copied += ["lease_owner", "lease_token", "lease_expires_at"]
    fixed: dict[str, Any] = {
        "id": child_id,
        "partition": partition_for(child_id),
        **schedule_columns(OnceSchedule(job.scheduled_for)),
        "schedule_anchor_at": job.scheduled_for,
        "scheduled_for": job.scheduled_for,
        "parent_job_id": job.id,
    }
    columns = [*copied, *fixed]
    source = select(
        *(jobs.c[name] for name in copied), *(literal(value, jobs.c[name].type) for name, value in fixed.items())
    )
    inserted = await conn.execute(insert(jobs).from_select(columns, source.where(*guard)).returning(jobs.c.id))
    if inserted.first() is None:
        return None
    parent = {**_next_occurrence_values(next_at, ended), "occurrence_claimed_at": None}
    parent["occurrences_run"] = jobs.c.occurrences_run + 1
    await conn.execute(update(jobs).where(*guard).values(**parent, updated_at=func.now()))
    return dataclasses.replace(
        job,
        id=child_id,
        partition=fixed["partition"],
        schedule=OnceSchedule(job.scheduled_for),
        schedule_anchor_at=job.scheduled_for,
        recurrence=None,
        occurrences_run=0,
    )


@dataclass(frozen=True)
class FinishedAttempt:
    job: ClaimedJob
    result: AttemptOutcome
    step: NextStep

    @property
    def lease(self) -> tuple[uuid.UUID, uuid.UUID]:
        return (self.job.id, self.job.lease_token)


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
            **_NO_LEASE,
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
            rows.extend(skipped_run_values(item.job, item.step.overlapped, "skipped_overlap", OVERLAP_REASON))
        await run_insert_many(conn, rows)
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


OVERLAP_REASON = "came due while the previous occurrence was still in flight (overlap_policy forbid)"
MISSED_REASON = "more than misfire_grace_s late; given up by the misfire policy"


def skipped_run_values(job: ClaimedJob, skipped: Skipped, outcome: str, reason: str) -> list[dict[str, Any]]:
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


async def job_settle_due_plan(
    conn: AsyncConnection,
    job: ClaimedJob,
    missed: Skipped,
    deliver_at: dt.datetime | None,
    next_at: dt.datetime | None,
    ended: EndReason | None,
) -> bool:
    """Applies a misfire decision to a claimed recurring job, guarded by its lease token.

    With `deliver_at`, the claimed occurrence becomes the one due then (the delivery follows).
    Without, nothing is delivered: the job waits for `next_at`, or ends (succeeded, with
    `ended`) when there is none. Missed fire times are recorded as `missed` runs.
    Returns False when the lease was lost meanwhile (nothing is written).
    """
    guard = _leased(job.id, job.lease_token)
    values = {"scheduled_for": deliver_at} if deliver_at is not None else _next_occurrence_values(next_at, ended)
    stmt = update(jobs).where(*guard).values(**values, updated_at=func.now()).returning(jobs.c.id)
    if (await conn.execute(stmt)).first() is None:
        return False
    rows = skipped_run_values(job, missed, "missed", MISSED_REASON)
    if rows:
        await run_insert_many(conn, rows)
    return True


def _next_occurrence_values(next_at: dt.datetime | None, ended: EndReason | None) -> dict[str, Any]:
    """A recurring job released from its claim: waiting for `next_at` as a new occurrence, or
    ended (succeeded, `ended`) when there is none."""
    if next_at is not None:
        waiting = {"state": JobState.SCHEDULED, "run_at": next_at, "scheduled_for": next_at}
        values: dict[str, Any] = {**waiting, "occurrence_id": uuid.uuid4()}
    else:
        values = {"state": JobState.SUCCEEDED, "ended_reason": ended or "schedule", "finished_at": func.now()}
    return {**values, "attempt": 0, **_NO_LEASE}


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
