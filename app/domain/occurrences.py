"""What a recurring job does at each occurrence: bounds, misfires, overlap and catch-up.

This module owns the scheduling semantics of cron and interval jobs; the fire-time math
itself stays in app/domain/schedule.py, cron.py and fire_times.py. Pure functions: `now` is
always passed in, there is no I/O, and every datetime returned is an aware UTC datetime.

In the order a job meets them:
- first_fire_time when a job is created or rescheduled (app/domain/job_plan.py; bounds
  decide its anchor and first fire time),
- plan_due when the scheduler claims a due occurrence (the misfire policy decides what to deliver),
- next_after_run when that occurrence is done (the overlap policy decides what comes next),
  or, under overlap ALLOW, as soon as it is handed off to a child job for delivery, so the
  next occurrence may start while it is still in flight.
Under FORBID the next occurrence is only planned once the current one is done, so overlap
means fire times that came due while one was in flight. A schedule with no fire time left
ends its job, decided in one place (_ends_when_no_fire_time_left).

How many fire times a backlog holds, and which to deliver, is counted without walking it
(app/domain/fire_times.py).
"""

from __future__ import annotations

import datetime as dt
import enum
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal, ParamSpec, TypeVar

from app.domain.cron import MAX_UPCOMING
from app.domain.fire_times import (
    CRON_COUNT_BUDGET,
    MAX_RECORDED_SKIPS,
    NO_SKIPS,
    CronTimes,
    FireTimes,
    IntervalTimes,
    Skipped,
)
from app.domain.schedule import MAX_JITTER_S, TICK, CronSchedule, IntervalSchedule, ScheduleError, first_fire

# Skipped and its limits are fire_times' own, named here too as part of this module's results.
__all__ = [
    "CRON_COUNT_BUDGET",
    "DEFAULT_CATCH_UP_LIMIT",
    "DEFAULT_MISFIRE_GRACE_S",
    "MAX_CATCH_UP_LIMIT",
    "MAX_RECORDED_SKIPS",
    "NO_SKIPS",
    "Bounds",
    "DuePlan",
    "EndReason",
    "IntervalMode",
    "MisfirePolicy",
    "NextAfterRun",
    "OnResume",
    "OverlapPolicy",
    "Recurrence",
    "Skipped",
    "due_delay",
    "first_fire_time",
    "next_after_run",
    "plan_due",
]

UTC = dt.UTC

# Catching up finds the catch_up_limit-th latest fire time with batches of that size,
# which croniter enumeration (app.domain.cron.upcoming) caps.
MAX_CATCH_UP_LIMIT: Final = MAX_UPCOMING
# A recurring job's policies when it sets none (the API documents them from here).
DEFAULT_MISFIRE_GRACE_S: Final = 60.0
DEFAULT_CATCH_UP_LIMIT: Final = 10

# "schedule": a cron expression with no fire time left (see _ends_when_no_fire_time_left).
EndReason = Literal["max_runs", "end_at", "schedule"]


class IntervalMode(enum.StrEnum):
    # Fire times are anchor + k * every_s, whatever a delivery takes.
    FIXED_RATE = "fixed_rate"
    # The next fire time is every_s after the previous occurrence finished.
    FIXED_DELAY = "fixed_delay"


class MisfirePolicy(enum.StrEnum):
    """What to deliver when an occurrence is claimed more than misfire_grace_s late."""

    SKIP = "skip"
    FIRE_ONCE = "fire_once"
    CATCH_UP = "catch_up"


class OnResume(enum.StrEnum):
    """What a resume does with the occurrences held while their target (or tenant) was paused."""

    # Each held occurrence is delivered however late: due again from its release, when the
    # misfire grace starts to count (see due_delay).
    DELIVER_ALL = "deliver_all"
    # Each goes back to the time it had, so its job's misfire policy judges it as if it had
    # never been held.
    MISFIRE_POLICY = "misfire_policy"


class OverlapPolicy(enum.StrEnum):
    """What becomes of fire times that come due while an occurrence is in flight."""

    ALLOW = "allow"
    FORBID = "forbid"


@dataclass(frozen=True)
class Bounds:
    start_at: dt.datetime | None = None
    end_at: dt.datetime | None = None  # inclusive: a fire time equal to end_at fires
    max_runs: int | None = None  # delivered occurrences (missed or skipped ones do not count)


@dataclass(frozen=True)
class Recurrence:
    schedule: CronSchedule | IntervalSchedule
    anchor: dt.datetime  # fixed-rate intervals count from here
    interval_mode: IntervalMode = IntervalMode.FIXED_RATE
    misfire_policy: MisfirePolicy = MisfirePolicy.FIRE_ONCE
    # A fire time at most this late still counts as on time.
    misfire_grace_s: float = DEFAULT_MISFIRE_GRACE_S
    # catch_up delivers at most this many missed occurrences of one backlog.
    catch_up_limit: int = DEFAULT_CATCH_UP_LIMIT
    overlap_policy: OverlapPolicy = OverlapPolicy.FORBID
    bounds: Bounds = Bounds()
    # Each occurrence fires up to this many seconds after its nominal fire time (the fire
    # times here are all nominal; app/domain/schedule.py: jitter_delay).
    jitter_s: int = 0

    @property
    def hands_off_occurrences(self) -> bool:
        """Whether each occurrence is delivered apart from the job (as a child job), so the
        next can start while it is in flight: overlap allowed, on a fixed grid. A fixed-delay
        interval's next fire time depends on when the previous one finished, so it never can."""
        fixed_delay = isinstance(self.schedule, IntervalSchedule) and self.interval_mode is IntervalMode.FIXED_DELAY
        return self.overlap_policy is OverlapPolicy.ALLOW and not fixed_delay

    def __post_init__(self) -> None:
        _check_aware("anchor", self.anchor)
        _validate_bounds(self.bounds)
        if isinstance(self.schedule, IntervalSchedule) and self.schedule.every_s <= 0:
            raise ScheduleError("every_s", "must be greater than 0")
        if not (math.isfinite(self.misfire_grace_s) and self.misfire_grace_s >= 0):
            raise ScheduleError("misfire_grace_s", "must be a number of seconds, 0 or more")
        if not 1 <= self.catch_up_limit <= MAX_CATCH_UP_LIMIT:
            raise ScheduleError("catch_up_limit", f"must be between 1 and {MAX_CATCH_UP_LIMIT}")
        if not 0 <= self.jitter_s <= MAX_JITTER_S:
            raise ScheduleError("jitter_s", f"must be between 0 and {MAX_JITTER_S}")


@dataclass(frozen=True)
class DuePlan:
    # The nominal fire time of the occurrence to deliver now, or None to deliver nothing.
    deliver_at: dt.datetime | None
    # Fire times given up (beyond the misfire grace); they are never delivered.
    missed: Skipped
    # Only when nothing is delivered: the fire time to claim the job at next (None if it
    # ended). When something is delivered it is None: next_after_run decides once it is done.
    next_at: dt.datetime | None
    ended: EndReason | None


@dataclass(frozen=True)
class NextAfterRun:
    next_at: dt.datetime | None  # may be in the past: then it is claimed at once and plan_due applies
    ended: EndReason | None
    overlapped: Skipped  # fire times dropped because they came due while the occurrence was in flight


def first_fire_time(
    schedule: CronSchedule | IntervalSchedule, bounds: Bounds, now: dt.datetime
) -> tuple[dt.datetime, dt.datetime] | None:
    """A new job's (anchor, first fire time), or None when the bounds leave no fire time.

    The first fire time is never in the past: at or after start_at when that is still
    ahead, otherwise (as without start_at) after `now`. An interval with start_at is anchored
    there, so its fire times stay on start_at's grid. Raises ScheduleError for invalid bounds.
    """
    _validate_bounds(bounds)
    first = first_fire(schedule, now, bounds.start_at)
    anchor = first
    if isinstance(schedule, IntervalSchedule) and bounds.start_at is not None:
        anchor = bounds.start_at.astimezone(UTC)  # fire times stay on start_at's grid
    if bounds.end_at is not None and first > bounds.end_at:
        return None
    return anchor, first


_Plan = TypeVar("_Plan", "DuePlan", "NextAfterRun")
_Args = ParamSpec("_Args")


def _ends_when_no_fire_time_left(ended: _Plan) -> Callable[[Callable[_Args, _Plan]], Callable[_Args, _Plan]]:
    """The one rule for a schedule with no fire time left: the job ends (ended_reason
    "schedule"), with nothing missed or overlapped. The fire-time math raises ScheduleError
    then (a date that has passed, the end of datetime); letting it escape would leave the
    job running and the reaper re-delivering it."""

    def decorate(plan: Callable[_Args, _Plan]) -> Callable[_Args, _Plan]:
        @functools.wraps(plan)
        def planned(*args: _Args.args, **kwargs: _Args.kwargs) -> _Plan:
            try:
                return plan(*args, **kwargs)
            except ScheduleError:
                return ended

        return planned

    return decorate


def due_delay(scheduled_for: dt.datetime, due_at: dt.datetime | None, jitter: dt.timedelta) -> dt.timedelta:
    """How long after its fire time `scheduled_for` an occurrence was due to run (`due_at`,
    its run_at when claimed; None: unknown), at least its `jitter`: plan_due's `fire_delay`,
    from which the misfire grace counts. Only a resume makes it longer than the jitter: an
    occurrence held while its target was paused and released with deliver_all is due from its
    release, not late for the pause (OnResume)."""
    if due_at is None:
        return jitter
    return max(jitter, due_at - scheduled_for)


@_ends_when_no_fire_time_left(DuePlan(None, NO_SKIPS, None, "schedule"))
def plan_due(
    rec: Recurrence,
    scheduled_for: dt.datetime,
    runs_done: int,
    now: dt.datetime,
    fire_delay: dt.timedelta = dt.timedelta(0),
) -> DuePlan:
    """What to deliver now that the occurrence due at `scheduled_for` has been claimed.

    Within misfire_grace_s of its fire time (`scheduled_for`, or `fire_delay` after it: for a
    jittered occurrence, which is not late for its jitter, or one released from a hold, which
    is not late for the pause, see due_delay), or claimed early, the occurrence is on time.
    Later, the late fire times are those from `scheduled_for` up to `now` (and end_at), and
    the misfire policy picks which one to deliver; the ones before it are missed:
    SKIP delivers the earliest one still within the grace, if any; FIRE_ONCE the latest one;
    CATCH_UP the oldest one, unless more than catch_up_limit are late, when the oldest
    surplus is missed. A fixed-delay interval's late fire times are scheduled_for + k * every_s.
    """
    scheduled_for = scheduled_for.astimezone(UTC)
    bounds = rec.bounds
    if bounds.max_runs is not None and runs_done >= bounds.max_runs:
        return DuePlan(None, NO_SKIPS, None, "max_runs")
    if bounds.end_at is not None and scheduled_for > bounds.end_at:
        return DuePlan(None, NO_SKIPS, None, "end_at")
    grace = dt.timedelta(seconds=rec.misfire_grace_s)
    if now - scheduled_for - fire_delay <= grace:
        return DuePlan(scheduled_for, NO_SKIPS, None, None)

    fire_times = _fire_times(rec, origin=scheduled_for)
    # The latest instant a late fire time may have; `scheduled_for` is the first of them.
    last = now if bounds.end_at is None else min(now, bounds.end_at)
    deliver_at: dt.datetime | None
    if rec.misfire_policy is MisfirePolicy.SKIP:
        # The earliest fire time at most misfire_grace_s before now still counts as on time.
        on_time = fire_times.following(now - grace - TICK)
        if on_time > last:
            missed = _from(scheduled_for, fire_times.span(scheduled_for, last))
            next_at, ended = _within_end(fire_times.following(now), bounds)
            return DuePlan(None, missed, next_at, ended)
        deliver_at = on_time
    elif rec.misfire_policy is MisfirePolicy.FIRE_ONCE:
        deliver_at = fire_times.kth_latest(scheduled_for, last, 1) or scheduled_for
    else:
        # Only when catch_up_limit fire times follow scheduled_for is the backlog over the cap;
        # then the catch_up_limit latest are delivered and the older ones missed.
        deliver_at = fire_times.kth_latest(scheduled_for, last, rec.catch_up_limit) or scheduled_for
    if deliver_at == scheduled_for:
        return DuePlan(deliver_at, NO_SKIPS, None, None)
    return DuePlan(deliver_at, _from(scheduled_for, fire_times.span(scheduled_for, deliver_at - TICK)), None, None)


@_ends_when_no_fire_time_left(NextAfterRun(None, "schedule", NO_SKIPS))
def next_after_run(
    rec: Recurrence,
    occurrence_at: dt.datetime,
    finished_at: dt.datetime,
    runs_done: int,
    *,
    claimed_at: dt.datetime | None = None,
) -> NextAfterRun:
    """The job's next occurrence once the one due at `occurrence_at` is done (succeeded or
    dead-lettered); `runs_done` already counts it and `finished_at` is when its last attempt
    finished.

    `claimed_at` is when the scheduler claimed this occurrence for its first attempt (the
    `now` given to plan_due). Fire times up to then were already due before the occurrence
    was in flight: a backlog, which plan_due's misfire policy handles, so they are never
    overlaps and the next occurrence is the first of them. Pass it, or a catch-up (or a
    SKIP delivery followed by more on-time fire times) under FORBID would drop that backlog
    as overlapped. Without it the occurrence counts as in flight from `occurrence_at`.

    Fire times that came due while it was in flight are, under FORBID, dropped (returned as
    `overlapped`) and the next occurrence is the first fire time after `finished_at`; under
    ALLOW the next occurrence is the first fire time after `occurrence_at` (the scheduler
    asks at hand-off, see Recurrence.hands_off_occurrences, so nothing waits for the delivery).
    A fixed-delay interval fires next every_s after `finished_at`.
    """
    occurrence_at = occurrence_at.astimezone(UTC)
    bounds = rec.bounds
    if bounds.max_runs is not None and runs_done >= bounds.max_runs:
        return NextAfterRun(None, "max_runs", NO_SKIPS)
    schedule = rec.schedule
    if isinstance(schedule, IntervalSchedule) and rec.interval_mode is IntervalMode.FIXED_DELAY:
        return _next_within_end(finished_at + dt.timedelta(seconds=schedule.every_s), NO_SKIPS, bounds)

    fire_times = _fire_times(rec, origin=occurrence_at)
    following = fire_times.following(occurrence_at)
    backlog = claimed_at is not None and following <= claimed_at
    if backlog or rec.overlap_policy is OverlapPolicy.ALLOW:
        return _next_within_end(following, NO_SKIPS, bounds)
    last_in_flight = finished_at if bounds.end_at is None else min(finished_at, bounds.end_at)
    overlapped = fire_times.span(occurrence_at, last_in_flight)
    return _next_within_end(fire_times.following(max(occurrence_at, finished_at)), overlapped, bounds)


def _fire_times(rec: Recurrence, *, origin: dt.datetime) -> FireTimes:
    """The fire times of `rec` from the occurrence at `origin` on."""
    if isinstance(rec.schedule, CronSchedule):
        return CronTimes(rec.schedule)
    # A fixed-delay job has no fixed grid: it is late only relative to its own occurrence.
    grid_origin = rec.anchor if rec.interval_mode is IntervalMode.FIXED_RATE else origin
    return IntervalTimes(rec.schedule, grid_origin.astimezone(UTC))


def _from(first: dt.datetime, rest: Skipped) -> Skipped:
    """`first` followed by the fire times in `rest`."""
    return Skipped((first, *rest.times)[:MAX_RECORDED_SKIPS], rest.total + 1, rest.truncated)


def _within_end(next_at: dt.datetime, bounds: Bounds) -> tuple[dt.datetime | None, EndReason | None]:
    if bounds.end_at is not None and next_at > bounds.end_at:
        return None, "end_at"
    return next_at.astimezone(UTC), None


def _next_within_end(next_at: dt.datetime, overlapped: Skipped, bounds: Bounds) -> NextAfterRun:
    at, ended = _within_end(next_at, bounds)
    return NextAfterRun(at, ended, overlapped)


def _validate_bounds(bounds: Bounds) -> None:
    if bounds.start_at is not None:
        _check_aware("start_at", bounds.start_at)
    if bounds.end_at is not None:
        _check_aware("end_at", bounds.end_at)
        if bounds.start_at is not None and bounds.end_at <= bounds.start_at:
            raise ScheduleError("end_at", "must be after start_at")
    if bounds.max_runs is not None and bounds.max_runs < 1:
        raise ScheduleError("max_runs", "must be at least 1")


def _check_aware(field: str, value: dt.datetime) -> None:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ScheduleError(field, "must include a UTC offset (RFC 3339)")
