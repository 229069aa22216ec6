"""Schedules and their fire-time math. Pure functions: `now` is always passed in.

A job has exactly one schedule:
- Once: fires at one instant (`run_at`, or `delay_s` from creation).
- Cron: a cron expression evaluated in an IANA time zone (syntax and DST policy in
  app/domain/cron.py).
- Interval: every `every_s` seconds, on a grid from its anchor (fixed rate) or after each
  run (fixed delay).

This module turns the API's schedule fields into a Schedule and owns the fire-time math:
the first fire time, the next cron fire time, the next point of an interval's grid, and an
occurrence's jitter (a delay past its nominal fire time, up to the job's `jitter_s`). What a
recurring job does at each occurrence (bounds, misfires, overlap, catch-up, and a schedule
with no fire time left) is app/domain/occurrences.py.
"""

from __future__ import annotations

import datetime as dt
import enum
import hashlib
import itertools
import math
import uuid
from dataclasses import dataclass

from app.domain.cron import CronError, next_fire, parse_cron, upcoming
from app.domain.cron_hash import has_hash, resolve_hashed

UTC = dt.UTC
# Datetimes have microsecond resolution: t < x is t <= x - TICK.
TICK = dt.timedelta(microseconds=1)

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


class ScheduleKind(enum.StrEnum):
    """What kind of schedule a job has (the jobs.schedule_kind column, CHECK-mirrored)."""

    ONCE = "once"
    CRON = "cron"
    INTERVAL = "interval"
    # Runs after another job's occurrences settle (app/domain/chains.py): no fire time of its own.
    AFTER = "after"


@dataclass(frozen=True)
class OnceSchedule:
    at: dt.datetime


@dataclass(frozen=True)
class CronSchedule:
    # The expression every fire time is computed from: with hashed values (`H`) resolved.
    expression: str
    timezone: str = "UTC"
    # The expression as written, when it holds `H` (app/domain/cron_hash.py); else None.
    source: str | None = None

    @property
    def written(self) -> str:
        """The expression as its user wrote it."""
        return self.source or self.expression


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


def first_fire(schedule: Schedule, now: dt.datetime, start_at: dt.datetime | None = None) -> dt.datetime:
    """The fire time of a new schedule's first occurrence.

    A one-off fires at its instant. A recurring schedule's first fire time is never in the
    past: at or after `start_at` when that is still ahead, otherwise (as without start_at)
    after `now`; an interval with `start_at` stays on start_at's grid.
    """
    _require_aware(now)
    if isinstance(schedule, OnceSchedule):
        return schedule.at.astimezone(UTC)
    start = None if start_at is None else start_at.astimezone(UTC)
    if isinstance(schedule, CronSchedule):
        if start is not None and start >= now:
            return next_cron_fire(schedule, start - TICK)  # start_at itself may fire
        return next_cron_fire(schedule, now)
    if start is None:
        return (now + dt.timedelta(seconds=schedule.every_s)).astimezone(UTC)
    # The first grid point at or after now; a start_at still ahead is itself the first.
    return start if start >= now else next_interval_fire(schedule, start, now - TICK)


def _require_aware(value: dt.datetime) -> None:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("naive datetime; pass an aware datetime")


def parse_schedule(
    *,
    run_at: dt.datetime | None,
    delay_s: float | None,
    cron: str | None,
    timezone: str | None,
    every_s: int | None,
    now: dt.datetime,
    seed: str | None = None,
) -> Schedule:
    """Turns the API's schedule fields into a Schedule (its first fire time: first_fire).

    Exactly one of run_at, delay_s, cron and every_s must be given; `timezone` only with cron.
    A cron expression with hashed values (`H`) is resolved with `seed` (hash_seed: the same
    job always gets the same values); without a seed it is refused.
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
        source = None
        if has_hash(cron):
            if seed is None:
                raise ScheduleError("cron", "hashed values (H) need a job to hash from")
            source, cron = cron, resolve_hashed(cron, seed)
        validate_cron(cron, zone_name, now)  # also rejects an unknown zone
        schedule = CronSchedule(cron, zone_name, source)
    else:
        assert every_s is not None
        if every_s <= 0:
            raise ScheduleError("every_s", "must be greater than 0")
        schedule = IntervalSchedule(every_s)
    return schedule


def hash_seed(tenant_id: uuid.UUID, job_id: uuid.UUID) -> str:
    """What a job's hashed cron values (`H`) are resolved from: its tenant and its id, which
    no edit changes, so the values hold across restarts, replicas, upgrades and edits."""
    return f"{tenant_id}:{job_id}"


# jitter_s bounds: at most an hour, and at most half the schedule's period, so jittered
# occurrences never swap places.
MAX_JITTER_S = 3600
# A cron schedule's period, for that bound: its shortest gap among this many fire times.
_PERIOD_SAMPLE = 24


def max_jitter_s(schedule: CronSchedule | IntervalSchedule, now: dt.datetime) -> int:
    """The largest jitter_s the schedule allows: half its period (a cron schedule's shortest
    gap between its next fire times), at most MAX_JITTER_S."""
    if isinstance(schedule, IntervalSchedule):
        period_s = float(schedule.every_s)
    else:
        fires = upcoming(parse_cron(schedule.expression), schedule.timezone, now, _PERIOD_SAMPLE)
        period_s = min(((b - a).total_seconds() for a, b in itertools.pairwise(fires)), default=0.0)
    return int(min(MAX_JITTER_S, period_s // 2))


def jitter_delay(job_id: uuid.UUID, nominal: dt.datetime, jitter_s: int) -> dt.timedelta:
    """How long after its nominal time the job's occurrence at `nominal` fires: a delay in
    [0, jitter_s] s (millisecond steps) drawn from a hash of the job and the occurrence, not
    from a random generator, so a rescued, retried-after-restart or re-read occurrence keeps
    its time and every process computes the same one."""
    if jitter_s <= 0:
        return dt.timedelta(0)
    micros = round(nominal.timestamp() * 1_000_000)
    digest = hashlib.blake2b(job_id.bytes + micros.to_bytes(8, "big", signed=True), digest_size=8).digest()
    return dt.timedelta(milliseconds=int.from_bytes(digest, "big") % (jitter_s * 1000 + 1))


def jittered(job_id: uuid.UUID, nominal: dt.datetime, jitter_s: int) -> dt.datetime:
    """The instant the occurrence at `nominal` fires (jitter_delay after it)."""
    return nominal + jitter_delay(job_id, nominal, jitter_s) if jitter_s > 0 else nominal
