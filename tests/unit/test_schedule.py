"""Fire-time math as pure functions of `now` (no clock, no database)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from app.domain.schedule import (
    CronSchedule,
    IntervalSchedule,
    OnceSchedule,
    Schedule,
    ScheduleError,
    first_fire,
    next_cron_fire,
    next_interval_fire,
    parse_schedule,
)

UTC = dt.UTC


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> dt.datetime:
    return dt.datetime(year, month, day, hour, minute, second, tzinfo=UTC)


@pytest.mark.parametrize(
    ("expression", "timezone", "after", "expected"),
    [
        # Plain UTC.
        ("*/15 * * * *", "UTC", utc(2026, 1, 1, 10, 7), utc(2026, 1, 1, 10, 15)),
        # Strictly after: a fire time equal to `after` is not returned again.
        ("0 9 * * *", "UTC", utc(2026, 1, 1, 9, 0), utc(2026, 1, 2, 9, 0)),
        # 09:00 in New York is 14:00 UTC in winter (EST, -5) ...
        ("0 9 * * *", "America/New_York", utc(2026, 1, 15, 0, 0), utc(2026, 1, 15, 14, 0)),
        # ... and 13:00 UTC in summer (EDT, -4).
        ("0 9 * * *", "America/New_York", utc(2026, 7, 15, 0, 0), utc(2026, 7, 15, 13, 0)),
        # Berlin across its spring change (2026-03-29): 08:00 local is 07:00 UTC, then 06:00 UTC.
        ("0 8 * * *", "Europe/Berlin", utc(2026, 3, 28, 8, 0), utc(2026, 3, 29, 6, 0)),
        ("0 8 * * *", "Europe/Berlin", utc(2026, 3, 27, 8, 0), utc(2026, 3, 28, 7, 0)),
        # Day-of-week: next Monday 00:00 in Tokyo (UTC+9) is Sunday 15:00 UTC.
        ("0 0 * * 1", "Asia/Tokyo", utc(2026, 11, 20, 0, 0), utc(2026, 11, 22, 15, 0)),
        # Month boundary.
        ("0 0 1 * *", "UTC", utc(2026, 1, 31, 23, 59), utc(2026, 2, 1, 0, 0)),
        # Leap day.
        ("0 0 29 2 *", "UTC", utc(2026, 3, 1), utc(2028, 2, 29)),
    ],
)
def test_next_cron_fire_golden(expression: str, timezone: str, after: dt.datetime, expected: dt.datetime) -> None:
    fire = next_cron_fire(CronSchedule(expression, timezone), after)
    assert fire == expected
    assert fire.utcoffset() == dt.timedelta(0)


def test_cron_result_does_not_depend_on_the_offset_of_now() -> None:
    schedule = CronSchedule("30 2 * * *", "Europe/Berlin")
    now_utc = utc(2026, 6, 1, 12, 0)
    now_tokyo = now_utc.astimezone(dt.timezone(dt.timedelta(hours=9)))
    assert next_cron_fire(schedule, now_utc) == next_cron_fire(schedule, now_tokyo)


def test_cron_that_never_fires_is_rejected_quickly() -> None:
    with pytest.raises(ScheduleError) as err:
        next_cron_fire(CronSchedule("0 0 30 2 *", "UTC"), utc(2026, 1, 1))
    assert err.value.field == "cron"


@pytest.mark.parametrize(
    ("anchor", "after", "expected"),
    [
        (utc(2026, 1, 1, 0, 0, 0), utc(2026, 1, 1, 0, 0, 0), utc(2026, 1, 1, 0, 0, 10)),
        (utc(2026, 1, 1, 0, 0, 0), utc(2026, 1, 1, 0, 0, 9), utc(2026, 1, 1, 0, 0, 10)),
        # Fixed rate: a late `after` lands on the anchor's grid, not `after + every`.
        (utc(2026, 1, 1, 0, 0, 0), utc(2026, 1, 1, 0, 0, 37), utc(2026, 1, 1, 0, 0, 40)),
        (utc(2026, 1, 1, 0, 0, 0), utc(2026, 1, 1, 0, 0, 40), utc(2026, 1, 1, 0, 0, 50)),
        # Before the anchor: the first step after it.
        (utc(2026, 1, 1, 0, 1, 0), utc(2026, 1, 1, 0, 0, 0), utc(2026, 1, 1, 0, 1, 10)),
    ],
)
def test_next_interval_fire_fixed_rate(anchor: dt.datetime, after: dt.datetime, expected: dt.datetime) -> None:
    assert next_interval_fire(IntervalSchedule(10), anchor, after) == expected


def test_naive_now_is_refused() -> None:
    with pytest.raises(ValueError, match="naive"):
        first_fire(IntervalSchedule(5), dt.datetime(2026, 1, 1))


NOW = utc(2026, 5, 5, 12, 0, 0)


def resolve_schedule(**fields: Any) -> tuple[Schedule, dt.datetime]:
    """A request's schedule and its first fire time, as a create computes them."""
    schedule = parse_schedule(**fields)
    return schedule, first_fire(schedule, fields["now"])


def test_resolve_each_schedule_kind() -> None:
    at = dt.datetime(2026, 5, 6, 8, 0, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    schedule, fire = resolve_schedule(run_at=at, delay_s=None, cron=None, timezone=None, every_s=None, now=NOW)
    assert schedule == OnceSchedule(utc(2026, 5, 6, 6, 0)) and fire == utc(2026, 5, 6, 6, 0)

    _, fire = resolve_schedule(run_at=None, delay_s=1.5, cron=None, timezone=None, every_s=None, now=NOW)
    assert fire == NOW + dt.timedelta(seconds=1.5)

    schedule, fire = resolve_schedule(
        run_at=None, delay_s=None, cron="0 9 * * *", timezone="America/New_York", every_s=None, now=NOW
    )
    assert schedule == CronSchedule("0 9 * * *", "America/New_York") and fire == utc(2026, 5, 5, 13, 0)

    schedule, fire = resolve_schedule(run_at=None, delay_s=None, cron=None, timezone=None, every_s=30, now=NOW)
    assert schedule == IntervalSchedule(30) and fire == NOW + dt.timedelta(seconds=30)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({}, "run_at"),
        ({"delay_s": 5, "every_s": 5}, "every_s"),
        ({"run_at": NOW, "cron": "* * * * *"}, "cron"),
        ({"cron": "not a cron"}, "cron"),
        ({"cron": "61 * * * *"}, "cron"),
        ({"cron": "0 0 31 4 *"}, "cron"),  # 31 April never exists
        ({"cron": "* * * * *", "timezone": "Mars/Olympus"}, "timezone"),
        ({"every_s": 5, "timezone": "UTC"}, "timezone"),
        ({"delay_s": 0}, "delay_s"),
        ({"delay_s": -1}, "delay_s"),
        ({"every_s": 0}, "every_s"),
        ({"run_at": dt.datetime(2026, 1, 1)}, "run_at"),
    ],
)
def test_resolve_rejects_bad_schedules_naming_the_field(fields: dict[str, object], field: str) -> None:
    args: dict[str, Any] = {"run_at": None, "delay_s": None, "cron": None, "timezone": None, "every_s": None}
    args.update(fields)
    with pytest.raises(ScheduleError) as err:
        parse_schedule(now=NOW, **args)
    assert err.value.field == field
