"""Planning a job from a request, pure: what a create makes (a scheduled job, or a chained
one), and the one-off jobs that carry a trigger or a dead letter's replay. `now` is passed
in. What a change (PATCH) of a waiting job resets is app/domain/job_updates.py.

The request arrives as JobFields (the API's JobCreate and JobUpdate fit it). A field that
is not sent keeps its current value (or the default); errors name the field, as
ScheduleError (schedule and recurrence fields) or PlanError (the others).
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any, Protocol

from app.domain.chains import ChainLink, ChainOn
from app.domain.completion import heartbeat_fits
from app.domain.cron_hash import has_hash
from app.domain.health import Expect
from app.domain.job import JobCompletion, NewJob
from app.domain.occurrences import Bounds, IntervalMode, MisfirePolicy, OverlapPolicy, Recurrence, first_fire_time
from app.domain.retry import RetryPolicy
from app.domain.schedule import (
    MAX_END_AT_AHEAD,
    IntervalSchedule,
    OnceSchedule,
    Schedule,
    ScheduleError,
    checked_instant,
    first_fire,
    hash_seed,
    max_jitter_s,
    parse_schedule,
)
from app.ids import new_id

SCHEDULE_FIELDS = frozenset({"run_at", "delay_s", "cron", "timezone", "every_s"})
POLICY_FIELDS = frozenset({"max_attempts", "backoff_base_s", "backoff_max_s", "backoff_factor"})
BOUND_FIELDS = frozenset({"start_at", "end_at", "max_runs"})
# In the order errors name them.
RECURRENCE_FIELDS = (
    "interval_mode",
    "misfire_policy",
    "misfire_grace_s",
    "catch_up_limit",
    "overlap_policy",
    "jitter_s",
    "start_at",
    "end_at",
    "max_runs",
)


class PlanError(ValueError):
    """A request field the plan cannot accept; `message` is said of `field`."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class JobFields(Protocol):
    """The schedule, retry and recurrence fields of a request, and which were sent."""

    @property
    def model_fields_set(self) -> set[str]: ...
    @property
    def max_attempts(self) -> int | None: ...
    @property
    def backoff_base_s(self) -> float | None: ...
    @property
    def backoff_max_s(self) -> float | None: ...
    @property
    def backoff_factor(self) -> float | None: ...
    @property
    def run_at(self) -> dt.datetime | None: ...
    @property
    def delay_s(self) -> float | None: ...
    @property
    def cron(self) -> str | None: ...
    @property
    def timezone(self) -> str | None: ...
    @property
    def every_s(self) -> int | None: ...
    @property
    def interval_mode(self) -> IntervalMode | None: ...
    @property
    def misfire_policy(self) -> MisfirePolicy | None: ...
    @property
    def misfire_grace_s(self) -> float | None: ...
    @property
    def catch_up_limit(self) -> int | None: ...
    @property
    def overlap_policy(self) -> OverlapPolicy | None: ...
    @property
    def jitter_s(self) -> int | None: ...
    @property
    def start_at(self) -> dt.datetime | None: ...
    @property
    def end_at(self) -> dt.datetime | None: ...
    @property
    def max_runs(self) -> int | None: ...
    @property
    def completion(self) -> str | None: ...
    @property
    def async_timeout_s(self) -> int | None: ...
    @property
    def heartbeat_timeout_s(self) -> int | None: ...


class ChainFields(Protocol):
    """A request's `after`: the parent and the outcome followed (None: success)."""

    @property
    def job_id(self) -> uuid.UUID: ...
    @property
    def on(self) -> ChainOn | None: ...


class ExpectFields(Protocol):
    """A request's `expect`: a recurring job's own health thresholds."""

    @property
    def success_within_s(self) -> int | None: ...
    @property
    def max_consecutive_failures(self) -> int | None: ...


class NewJobFields(JobFields, Protocol):
    """A create request: the job's own fields as well."""

    @property
    def target_id(self) -> uuid.UUID: ...
    @property
    def name(self) -> str | None: ...
    @property
    def payload(self) -> Any: ...
    @property
    def priority(self) -> int: ...
    @property
    def dedup_key(self) -> str | None: ...
    @property
    def after(self) -> ChainFields | None: ...
    @property
    def payload_from(self) -> str | None: ...
    @property
    def labels(self) -> dict[str, str] | None: ...
    @property
    def expect(self) -> ExpectFields | None: ...
    @property
    def on_success_target_id(self) -> uuid.UUID | None: ...
    @property
    def on_failure_target_id(self) -> uuid.UUID | None: ...


def plan_create(
    fields: NewJobFields,
    tenant_id: uuid.UUID,
    defaults: RetryPolicy,
    now: dt.datetime,
    job_id: uuid.UUID | None = None,
) -> NewJob:
    """The job a create request makes; `defaults` is the retry policy of a job that sets none.
    A cron expression with hashed values (`H`) is resolved from the job's id: `job_id`, or
    one minted here (the job then carries it)."""
    policy = retry_policy(fields, defaults)
    if fields.after is not None:
        return _plan_chained(fields, fields.after, tenant_id, policy, now)
    if fields.payload_from is not None:
        raise PlanError("payload_from", "applies only to a chained job (after)")
    if job_id is None and fields.cron is not None and has_hash(fields.cron):
        job_id = new_id()
    seed = None if job_id is None else hash_seed(tenant_id, job_id)
    schedule = parse_fields_schedule(fields, fields.cron, fields.timezone, now, seed)
    recurrence, anchor_at, first_fire_at = plan_recurrence(fields, schedule, now)
    expect = plan_expect(fields.expect, recurring=recurrence is not None)
    return NewJob(
        tenant_id=tenant_id,
        target_id=fields.target_id,
        name=fields.name,
        payload=fields.payload,
        priority=fields.priority,
        schedule=schedule,
        first_fire_at=first_fire_at,
        policy=policy,
        dedup_key=fields.dedup_key,
        recurrence=recurrence,
        anchor_at=anchor_at,
        completion=job_completion(fields),
        id=job_id,
        labels=fields.labels,
        expect=expect,
        on_success_target_id=fields.on_success_target_id,
        on_failure_target_id=fields.on_failure_target_id,
    )


def _plan_chained(
    fields: NewJobFields, after: ChainFields, tenant_id: uuid.UUID, policy: RetryPolicy, now: dt.datetime
) -> NewJob:
    """A chained job: no schedule of its own (its occurrences come from its parent's), so no
    schedule or recurrence field; it is armed from `now`."""
    sent = fields.model_fields_set
    for name in (*sorted(SCHEDULE_FIELDS), *RECURRENCE_FIELDS):
        if name in sent and getattr(fields, name) is not None:
            raise ScheduleError(name, "a chained job (after) runs when its parent settles: it takes no schedule")
    link = ChainLink(after.job_id, after.on or ChainOn.SUCCESS, fields.payload_from)
    plan_expect(fields.expect, recurring=False)
    return NewJob(
        tenant_id=tenant_id,
        target_id=fields.target_id,
        name=fields.name,
        payload=fields.payload,
        priority=fields.priority,
        schedule=OnceSchedule(now),
        first_fire_at=now,
        policy=policy,
        dedup_key=fields.dedup_key,
        completion=job_completion(fields),
        after=link,
        labels=fields.labels,
        on_success_target_id=fields.on_success_target_id,
        on_failure_target_id=fields.on_failure_target_id,
    )


COMPLETION_FIELDS = ("completion", "async_timeout_s", "heartbeat_timeout_s")
# The targets told of each settled occurrence (events to them, app/domain/events.py).
CALLBACK_FIELDS = ("on_success_target_id", "on_failure_target_id")


def plan_expect(fields: ExpectFields | None, *, recurring: bool) -> Expect | None:
    """A job's own health thresholds (app/domain/health.py), or None when it sets none: only
    a recurring job has a schedule to keep."""
    if fields is None:
        return None
    if not recurring:
        raise PlanError("expect", "applies only to a recurring job (cron or every_s)")
    if fields.success_within_s is None and fields.max_consecutive_failures is None:
        raise PlanError("expect", "give success_within_s, max_consecutive_failures or both (or null for none)")
    return Expect(fields.success_within_s, fields.max_consecutive_failures)


def job_completion(fields: JobFields) -> JobCompletion | None:
    """The job's own completion settings, or None when it sets none (its target's apply)."""
    if fields.completion is None and fields.async_timeout_s is None and fields.heartbeat_timeout_s is None:
        return None
    # Checked here, not by the request model: a validator there costs every create.
    if not heartbeat_fits(fields.async_timeout_s, fields.heartbeat_timeout_s):
        raise PlanError("heartbeat_timeout_s", "must not exceed async_timeout_s")
    mode = None if fields.completion is None else str(fields.completion)
    return JobCompletion(mode, fields.async_timeout_s, fields.heartbeat_timeout_s)


def plan_one_off(
    *,
    tenant_id: uuid.UUID,
    target_id: uuid.UUID,
    name: str | None,
    payload: Any,
    priority: int,
    policy: RetryPolicy,
    due: dt.datetime,
    parent_job_id: uuid.UUID | None = None,
    completion: JobCompletion | None = None,
) -> NewJob:
    """A one-off job due at `due` with fresh attempts: a trigger's extra occurrence (naming
    its recurring parent) or a dead letter's replay."""
    return NewJob(
        tenant_id=tenant_id,
        target_id=target_id,
        name=name,
        payload=payload,
        priority=priority,
        schedule=OnceSchedule(due),
        first_fire_at=due,
        policy=policy,
        parent_job_id=parent_job_id,
        completion=completion,
    )


def retry_policy(fields: JobFields, base: RetryPolicy) -> RetryPolicy:
    """The request's retry fields over `base` (the defaults, or the job's current policy)."""
    if (
        fields.max_attempts is None
        and fields.backoff_base_s is None
        and fields.backoff_max_s is None
        and fields.backoff_factor is None
    ):
        policy = base  # the same policy (frozen): a batch's jobs mostly share one
    else:
        policy = RetryPolicy(
            max_attempts=fields.max_attempts or base.max_attempts,
            backoff_base_s=fields.backoff_base_s or base.backoff_base_s,
            backoff_max_s=fields.backoff_max_s or base.backoff_max_s,
            backoff_factor=fields.backoff_factor or base.backoff_factor,
        )
    if policy.backoff_max_s < policy.backoff_base_s:
        # Name the field the client sent: a base above the (default or current) cap, or a cap below the base.
        if "backoff_max_s" in fields.model_fields_set:
            raise PlanError("backoff_max_s", "must be at least backoff_base_s")
        raise PlanError("backoff_base_s", f"must be at most backoff_max_s ({policy.backoff_max_s:g} s)")
    return policy


def plan_recurrence(
    fields: JobFields, schedule: Schedule, now: dt.datetime, current: Recurrence | None = None
) -> tuple[Recurrence | None, dt.datetime, dt.datetime]:
    """A schedule's (recurrence, anchor, first fire time): for a recurring job its policies
    and bounds (the request's, over `current`'s), for a one-off None and its instant."""
    sent = fields.model_fields_set
    given = [f for f in RECURRENCE_FIELDS if f in sent and getattr(fields, f) is not None]
    if isinstance(schedule, OnceSchedule):
        if given:
            raise ScheduleError(given[0], "applies only to a recurring job (cron or every_s)")
        at = first_fire(schedule, now)
        return None, at, at
    if fields.interval_mode is not None and not isinstance(schedule, IntervalSchedule):
        raise ScheduleError("interval_mode", "applies only to an every_s schedule")
    base = current or Recurrence(schedule, anchor=now)  # the default policies
    # A bound sent as null is removed (PATCH); one not sent stays as it was.
    start_at = fields.start_at if "start_at" in sent else base.bounds.start_at
    end_at = fields.end_at if "end_at" in sent else base.bounds.end_at
    bounds = Bounds(
        None if start_at is None else checked_instant("start_at", start_at, now),
        None if end_at is None else checked_instant("end_at", end_at, now, MAX_END_AT_AHEAD),
        fields.max_runs if "max_runs" in sent else base.bounds.max_runs,
    )
    first = first_fire_time(schedule, bounds, now)
    if first is None:
        raise ScheduleError("end_at", "the schedule never fires before end_at")
    anchor, first_at = first
    recurrence = Recurrence(
        schedule=schedule,
        anchor=anchor,
        interval_mode=fields.interval_mode or base.interval_mode,
        misfire_policy=fields.misfire_policy or base.misfire_policy,
        misfire_grace_s=fields.misfire_grace_s if fields.misfire_grace_s is not None else base.misfire_grace_s,
        catch_up_limit=fields.catch_up_limit or base.catch_up_limit,
        overlap_policy=fields.overlap_policy or base.overlap_policy,
        bounds=bounds,
        jitter_s=fields.jitter_s if fields.jitter_s is not None else base.jitter_s,
    )
    # A new schedule is held to a jitter kept from before, too: half its period at most.
    if recurrence.jitter_s and recurrence.jitter_s > (most := max_jitter_s(schedule, now)):
        raise ScheduleError("jitter_s", f"must be at most half the schedule's period and at most an hour: {most} s")
    return recurrence, anchor, first_at


def parse_fields_schedule(
    fields: JobFields, cron: str | None, timezone: str | None, now: dt.datetime, seed: str | None
) -> Schedule:
    return parse_schedule(
        run_at=fields.run_at,
        delay_s=fields.delay_s,
        cron=cron,
        timezone=timezone,
        every_s=fields.every_s,
        now=now,
        seed=seed,
    )
