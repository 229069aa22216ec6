"""Schedules and their fire-time math. Pure functions: `now` is always passed in.

A job has exactly one schedule:
- Once: fires at one instant (`run_at`, or `delay_s` from creation).
- Cron: a cron expression evaluated in an IANA time zone (syntax and DST policy in
  app/domain/cron.py).
- Interval: every `every_s` seconds, anchored at the first fire time (fixed rate).

Missed occurrences (the service was down or backlogged) are coalesced: after an occurrence
runs, the next fire time is the first one strictly after both the occurrence and `now`.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass

from app.domain.cron import CronError, next_fire, parse_cron

UTC = dt.UTC

# run_at bounds: earlier is surely a mistake (a past run_at fires at once); later, a typo.
# They also keep every stored instant far from the ends of datetime (PostgreSQL would keep
# year 1 and year 9999 as -infinity/infinity, which no datetime can hold).
EARLIEST_RUN_AT = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
MAX_SCHEDULE_AHEAD = dt.timedelta(days=3653)
# A recurring job's end_at may be further out than a first fire time.
MAX_END_AT_AHEAD = dt.timedelta(days=36525)


# One error type for every schedule field: `field` names the input, `message` says why.
ScheduleError = CronError


def checked_instant(
    field: str, value: dt.datetime, now: dt.datetime, ahead: dt.timedelta = MAX_SCHEDULE_AHEAD
) -> dt.datetime:
    """`value` in UTC, if it has an offset and lies between 2000-01-01 and `now + ahead`."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ScheduleError(field, "must include a UTC offset (RFC 3339)")
    try:
        at = value.astimezone(UTC)
        in_range = EARLIEST_RUN_AT <= at <= now + ahead
    except OverflowError:  # year 1 or 9999 pushed past the end of datetime by its offset
        in_range = False
    if not in_range:
        raise ScheduleError(field, f"must be between 2000-01-01 and {ahead.days // 365} years from now")
    return at


@dataclass(frozen=True)
class OnceSchedule:
    at: dt.datetime


@dataclass(frozen=True)
class CronSchedule:
    expression: str
    timezone: str = "UTC"


@dataclass(frozen=True)
class IntervalSchedule:
    every_s: int


Schedule = OnceSchedule | CronSchedule | IntervalSchedule


def validate_cron(expression: str, timezone: str, now: dt.datetime) -> None:
    """Raises ScheduleError unless the expression parses and fires within the bound."""
    next_fire(parse_cron(expression), timezone, now)


def next_cron_fire(schedule: CronSchedule, after: dt.datetime) -> dt.datetime:
    """The first fire time strictly after `after`, as an aware UTC datetime (DST policy in
    app/domain/cron.py)."""
    _require_aware(after)
    return next_fire(parse_cron(schedule.expression), schedule.timezone, after)


def next_interval_fire(schedule: IntervalSchedule, anchor: dt.datetime, after: dt.datetime) -> dt.datetime:
    """The first time `anchor + k * every_s` (k >= 1) strictly after `after` (fixed rate)."""
    _require_aware(anchor)
    _require_aware(after)
    step = dt.timedelta(seconds=schedule.every_s)
    if after < anchor:
        return anchor + step
    elapsed = (after - anchor) / step
    k = max(1, math.floor(elapsed) + 1)
    return anchor + k * step


def first_fire(schedule: Schedule, now: dt.datetime) -> dt.datetime:
    """The fire time of a newly created job's first occurrence."""
    _require_aware(now)
    if isinstance(schedule, OnceSchedule):
        return schedule.at.astimezone(UTC)
    if isinstance(schedule, CronSchedule):
        return next_cron_fire(schedule, now)
    return now + dt.timedelta(seconds=schedule.every_s)


def next_fire_after_occurrence(
    schedule: Schedule, occurrence: dt.datetime, anchor: dt.datetime, now: dt.datetime
) -> dt.datetime | None:
    """The next fire time once the occurrence due at `occurrence` is done; None for one-offs.

    Missed fire times between `occurrence` and `now` are coalesced (skipped).
    """
    if isinstance(schedule, OnceSchedule):
        return None
    after = max(occurrence, now)
    if isinstance(schedule, CronSchedule):
        return next_cron_fire(schedule, after)
    return next_interval_fire(schedule, anchor, after)


def _require_aware(value: dt.datetime) -> None:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("naive datetime; pass an aware datetime")


def resolve_schedule(
    *,
    run_at: dt.datetime | None,
    delay_s: float | None,
    cron: str | None,
    timezone: str | None,
    every_s: int | None,
    now: dt.datetime,
) -> tuple[Schedule, dt.datetime]:
    """Turns the API's schedule fields into a Schedule and its first fire time.

    Exactly one of run_at, delay_s, cron and every_s must be given; `timezone` only with cron.
    """
    given = [
        name
        for name, value in (("run_at", run_at), ("delay_s", delay_s), ("cron", cron), ("every_s", every_s))
        if value is not None
    ]
    if len(given) != 1:
        field = given[1] if len(given) > 1 else "run_at"
        if given:
            message = f"give exactly one schedule; got {', '.join(given)}"
        else:
            message = "a schedule is required: one of run_at, delay_s, cron, every_s"
        raise ScheduleError(field, message)
    if timezone is not None and cron is None:
        raise ScheduleError("timezone", "timezone applies only to a cron schedule")

    schedule: Schedule
    if run_at is not None:
        schedule = OnceSchedule(checked_instant("run_at", run_at, now))
    elif delay_s is not None:
        if delay_s <= 0:
            raise ScheduleError("delay_s", "must be greater than 0")
        schedule = OnceSchedule(now + dt.timedelta(seconds=delay_s))
    elif cron is not None:
        zone_name = timezone or "UTC"
        validate_cron(cron, zone_name, now)  # also rejects an unknown zone
        schedule = CronSchedule(cron, zone_name)
    else:
        assert every_s is not None
        if every_s <= 0:
            raise ScheduleError("every_s", "must be greater than 0")
        schedule = IntervalSchedule(every_s)
    return schedule, first_fire(schedule, now)
