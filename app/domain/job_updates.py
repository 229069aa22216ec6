"""Planning a change (PATCH, and a named schedule's PUT) of a waiting job, pure: which
policies change, and whether a new schedule or new bounds start a fresh occurrence. The
request's fields are read as a create reads them (app/domain/job_plan.py); `now` is passed in.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass

from app.domain.job_plan import (
    BOUND_FIELDS,
    POLICY_FIELDS,
    RECURRENCE_FIELDS,
    SCHEDULE_FIELDS,
    JobFields,
    PlanError,
    parse_fields_schedule,
    plan_recurrence,
    retry_policy,
)
from app.domain.occurrences import Recurrence
from app.domain.retry import RetryPolicy
from app.domain.schedule import CronSchedule, Schedule, ScheduleError
from app.domain.states import JobState


@dataclass(frozen=True)
class Rescheduled:
    """A new schedule or new bounds: a new occurrence, with no attempts made and a new webhook-id."""

    schedule: Schedule
    recurrence: Recurrence | None
    anchor_at: dt.datetime
    first_fire_at: dt.datetime
    # The job waits for first_fire_at in this state; None: it stays paused.
    state: JobState | None


@dataclass(frozen=True)
class JobChanges:
    """What a PATCH changes of a waiting job's schedule and policies (its plain fields aside)."""

    policy: RetryPolicy | None = None
    # New misfire, overlap or interval policies; the schedule and its occurrence stand.
    recurrence: Recurrence | None = None
    rescheduled: Rescheduled | None = None


def plan_update(
    fields: JobFields,
    *,
    seed: str,
    state: JobState,
    attempts_made: int,
    policy: RetryPolicy,
    schedule: Schedule,
    recurrence: Callable[[], Recurrence | None],
    now: dt.datetime,
) -> JobChanges:
    """The changes a PATCH makes to a waiting job (scheduled, retrying or paused).

    `recurrence` gives the job's current recurrence; it is read only when the change touches
    the schedule, so a job paused because its recurrence columns could not be loaded can
    still have its other fields changed.
    """
    sent = fields.model_fields_set
    new_occurrence = bool(sent & (SCHEDULE_FIELDS | BOUND_FIELDS))
    new_policy = None
    if sent & POLICY_FIELDS:
        new_policy = _changed_policy(fields, policy, 0 if new_occurrence else attempts_made)
    if not sent & (SCHEDULE_FIELDS | set(RECURRENCE_FIELDS)):
        return JobChanges(policy=new_policy)
    if sent & SCHEDULE_FIELDS:
        schedule = _replaced_schedule(fields, schedule, now, seed)
    new_recurrence, anchor_at, first_fire_at = plan_recurrence(fields, schedule, now, recurrence())
    if not new_occurrence:
        # Misfire and overlap policies apply from the next claim; the schedule stands.
        return JobChanges(policy=new_policy, recurrence=new_recurrence)
    waiting = None if state == JobState.PAUSED else JobState.SCHEDULED
    return JobChanges(
        policy=new_policy,
        rescheduled=Rescheduled(schedule, new_recurrence, anchor_at, first_fire_at, waiting),
    )


def _changed_policy(fields: JobFields, current: RetryPolicy, attempts_made: int) -> RetryPolicy:
    policy = retry_policy(fields, current)
    # A waiting job with attempts made has a retry pending, which will be one more attempt.
    if attempts_made and policy.max_attempts <= attempts_made:
        raise PlanError(
            "max_attempts",
            f"must be more than the {attempts_made} attempts already made: a retry is pending "
            "(cancel the job to stop it)",
        )
    return policy


def _replaced_schedule(fields: JobFields, current: Schedule, now: dt.datetime, seed: str) -> Schedule:
    """The schedule a PATCH sends; a cron job keeps its zone for a new expression and its
    expression for a new zone."""
    sent = fields.model_fields_set
    cron, timezone = fields.cron, fields.timezone
    schedule_sent = sorted(sent & SCHEDULE_FIELDS)
    if all(getattr(fields, field) is None for field in schedule_sent):
        raise ScheduleError(schedule_sent[0], "a job's schedule can be replaced, not removed")
    if schedule_sent == ["timezone"] and not isinstance(current, CronSchedule):
        raise ScheduleError("timezone", "applies only to a cron schedule")
    if isinstance(current, CronSchedule):
        if cron is None and timezone is not None:
            cron = current.written  # a new time zone for the same expression
        if cron is not None and "timezone" not in sent:
            timezone = current.timezone  # a new expression in the job's own time zone
    return parse_fields_schedule(fields, cron, timezone, now, seed)
