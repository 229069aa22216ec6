"""Recurring-job semantics (app.domain.occurrences): bounds, misfires, overlap, catch-up.

Every expected datetime was worked out by hand (zone offsets noted beside the DST cases).
Pure: no database, no clock, no sleeping; `now` is always an argument.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

import pytest

from app.domain.occurrences import (
    NO_SKIPS,
    Bounds,
    DuePlan,
    IntervalMode,
    MisfirePolicy,
    NextAfterRun,
    OverlapPolicy,
    Recurrence,
    Skipped,
    first_fire_time,
    next_after_run,
    plan_due,
)
from app.domain.schedule import CronSchedule, IntervalSchedule, ScheduleError

UTC = dt.UTC
SECOND = dt.timedelta(seconds=1)
MINUTE = dt.timedelta(minutes=1)
TICK = dt.timedelta(microseconds=1)

HOURLY = CronSchedule("0 * * * *")
QUARTER_HOURLY = CronSchedule("*/15 * * * *")
EVERY_5_MIN_CRON = CronSchedule("*/5 * * * *")
EVERY_SECOND_CRON = CronSchedule("* * * * * *")
# 01:30 local: EDT (-4) is 05:30Z, EST (-5) is 06:30Z. New York falls back on 2026-11-01
# (01:00-02:00 happens twice; a fixed-time schedule fires at the first, EDT) and springs
# forward on 2026-03-08 (01:30 is still EST that night).
NEW_YORK_0130 = CronSchedule("30 1 * * *", "America/New_York")


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0, micro: int = 0
) -> dt.datetime:
    return dt.datetime(year, month, day, hour, minute, second, micro, tzinfo=UTC)


def at(hour: int, minute: int, second: int = 0, micro: int = 0) -> dt.datetime:
    """A time on 2026-01-01, the day most tables use."""
    return utc(2026, 1, 1, hour, minute, second, micro)


def every(seconds: int) -> IntervalSchedule:
    return IntervalSchedule(seconds)


MIDNIGHT = at(0, 0)


def recurrence(schedule: CronSchedule | IntervalSchedule, anchor: dt.datetime = MIDNIGHT, **fields: Any) -> Recurrence:
    return Recurrence(schedule, anchor, **fields)


def skipped(*times: dt.datetime) -> Skipped:
    return Skipped(times, len(times), truncated=False)


def minutes_from(start: dt.datetime, count: int) -> tuple[dt.datetime, ...]:
    return tuple(start + index * MINUTE for index in range(count))


# first_fire_time ------------------------------------------------------------------------

NOW = at(10, 20)


@pytest.mark.parametrize(
    ("schedule", "bounds", "now", "expected"),
    [
        # No bounds: the next fire time strictly after now, as before bounds existed.
        (HOURLY, Bounds(), NOW, (at(11, 0), at(11, 0))),
        (HOURLY, Bounds(), at(10, 0), (at(11, 0), at(11, 0))),
        # start_at ahead: start_at itself fires when it is a fire time ...
        (HOURLY, Bounds(start_at=utc(2026, 1, 2, 5, 0)), NOW, (utc(2026, 1, 2, 5, 0), utc(2026, 1, 2, 5, 0))),
        # ... otherwise the first fire time after it.
        (HOURLY, Bounds(start_at=utc(2026, 1, 2, 5, 30)), NOW, (utc(2026, 1, 2, 6, 0), utc(2026, 1, 2, 6, 0))),
        # start_at now, on a fire time: fires now (at or after start_at, not in the past).
        (HOURLY, Bounds(start_at=at(10, 0)), at(10, 0), (at(10, 0), at(10, 0))),
        # start_at in the past: never a past fire time.
        (HOURLY, Bounds(start_at=at(8, 0)), NOW, (at(11, 0), at(11, 0))),
        # end_at is inclusive.
        (HOURLY, Bounds(end_at=at(11, 0)), NOW, (at(11, 0), at(11, 0))),
        (HOURLY, Bounds(end_at=at(10, 59, 59)), NOW, None),
        # Interval without start_at: anchored one period from now.
        (every(300), Bounds(), NOW, (at(10, 25), at(10, 25))),
        # Interval with start_at ahead: anchored at it, and it is the first fire time.
        (every(300), Bounds(start_at=at(12, 0)), NOW, (at(12, 0), at(12, 0))),
        # start_at past: anchored at it; the first grid point at or after now (10:02 + 4 * 5 min).
        (every(300), Bounds(start_at=at(10, 2)), NOW, (at(10, 2), at(10, 22))),
        # A grid point equal to now is not in the past.
        (every(300), Bounds(start_at=at(10, 0)), NOW, (at(10, 0), at(10, 20))),
        (every(300), Bounds(start_at=at(10, 2), end_at=at(10, 21)), NOW, None),
        (every(300), Bounds(end_at=at(10, 24)), NOW, None),
        (every(300), Bounds(end_at=at(10, 25)), NOW, (at(10, 25), at(10, 25))),
        # DST: start_at 2026-11-01 00:00 EDT (04:00Z); 01:30 that night fires at its first (EDT) pass.
        (
            NEW_YORK_0130,
            Bounds(start_at=utc(2026, 11, 1, 4, 0)),
            utc(2026, 10, 20),
            (utc(2026, 11, 1, 5, 30), utc(2026, 11, 1, 5, 30)),
        ),
    ],
)
def test_first_fire_time(
    schedule: CronSchedule | IntervalSchedule,
    bounds: Bounds,
    now: dt.datetime,
    expected: tuple[dt.datetime, dt.datetime] | None,
) -> None:
    assert first_fire_time(schedule, bounds, now) == expected


def test_first_fire_time_returns_utc_whatever_the_offset_of_start_at() -> None:
    tokyo = dt.timezone(dt.timedelta(hours=9))
    start_at = dt.datetime(2026, 1, 1, 21, 0, tzinfo=tokyo)  # 12:00Z
    result = first_fire_time(every(300), Bounds(start_at=start_at), NOW)
    assert result == (at(12, 0), at(12, 0))
    assert result is not None and all(value.utcoffset() == dt.timedelta(0) for value in result)


@pytest.mark.parametrize(
    ("bounds", "field"),
    [
        (Bounds(start_at=at(12, 0), end_at=at(11, 0)), "end_at"),
        (Bounds(start_at=at(12, 0), end_at=at(12, 0)), "end_at"),
        (Bounds(max_runs=0), "max_runs"),
        (Bounds(max_runs=-1), "max_runs"),
        (Bounds(start_at=dt.datetime(2026, 1, 1, 12, 0)), "start_at"),
        (Bounds(end_at=dt.datetime(2026, 1, 1, 12, 0)), "end_at"),
    ],
)
def test_first_fire_time_rejects_invalid_bounds(bounds: Bounds, field: str) -> None:
    with pytest.raises(ScheduleError) as caught:
        first_fire_time(HOURLY, bounds, NOW)
    assert caught.value.field == field


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"catch_up_limit": 0}, "catch_up_limit"),
        ({"catch_up_limit": 1001}, "catch_up_limit"),
        ({"misfire_grace_s": -1.0}, "misfire_grace_s"),
        ({"misfire_grace_s": math.nan}, "misfire_grace_s"),
        ({"anchor": dt.datetime(2026, 1, 1)}, "anchor"),
        ({"bounds": Bounds(max_runs=0)}, "max_runs"),
        ({"schedule": IntervalSchedule(0)}, "every_s"),
    ],
)
def test_recurrence_rejects_invalid_policies(fields: dict[str, Any], field: str) -> None:
    arguments: dict[str, Any] = {"schedule": every(60), "anchor": at(0, 0), **fields}
    with pytest.raises(ScheduleError) as caught:
        Recurrence(**arguments)
    assert caught.value.field == field


# plan_due: on time, and the grace boundary ----------------------------------------------

ALL_POLICIES = list(MisfirePolicy)


@pytest.mark.parametrize("policy", ALL_POLICIES)
@pytest.mark.parametrize(
    "now",
    [
        at(10, 5),  # due now
        at(10, 4, 59),  # claimed a little early
        at(10, 5, 30),
        at(10, 6, 0),  # exactly misfire_grace_s late: still on time
    ],
)
def test_within_grace_the_occurrence_is_delivered_as_scheduled(policy: MisfirePolicy, now: dt.datetime) -> None:
    rec = recurrence(every(60), misfire_policy=policy, misfire_grace_s=60.0)
    assert plan_due(rec, at(10, 5), 0, now) == DuePlan(at(10, 5), NO_SKIPS, None, None)


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        # Late fire times 10:05 and 10:06; only 10:06 is within the grace.
        (MisfirePolicy.SKIP, DuePlan(at(10, 6), skipped(at(10, 5)), None, None)),
        (MisfirePolicy.FIRE_ONCE, DuePlan(at(10, 6), skipped(at(10, 5)), None, None)),
        (MisfirePolicy.CATCH_UP, DuePlan(at(10, 5), NO_SKIPS, None, None)),
    ],
)
def test_one_microsecond_past_the_grace_is_a_misfire(policy: MisfirePolicy, expected: DuePlan) -> None:
    rec = recurrence(every(60), misfire_policy=policy, misfire_grace_s=60.0)
    assert plan_due(rec, at(10, 5), 0, at(10, 6, 0, 1)) == expected


def test_zero_grace_makes_any_lateness_a_misfire() -> None:
    rec = recurrence(every(60), misfire_policy=MisfirePolicy.SKIP, misfire_grace_s=0.0)
    assert plan_due(rec, at(10, 5), 0, at(10, 5)) == DuePlan(at(10, 5), NO_SKIPS, None, None)
    assert plan_due(rec, at(10, 5), 0, at(10, 5, 0, 1)) == DuePlan(None, skipped(at(10, 5)), at(10, 6), None)


# plan_due after an outage ----------------------------------------------------------------

# Every minute, anchored at midnight; down from 10:00 to 10:30:30. Late fire times are
# 10:00 ... 10:30 (31 of them); with the 60 s grace only 10:30 is on time (cutoff 10:29:30).
OUTAGE_NOW = at(10, 30, 30)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (
            {"misfire_policy": MisfirePolicy.SKIP},
            DuePlan(at(10, 30), skipped(*minutes_from(at(10, 0), 30)), None, None),
        ),
        (
            {"misfire_policy": MisfirePolicy.FIRE_ONCE},
            DuePlan(at(10, 30), skipped(*minutes_from(at(10, 0), 30)), None, None),
        ),
        # 31 late, 10 caught up (10:21 ... 10:30): the oldest 21 are missed.
        (
            {"misfire_policy": MisfirePolicy.CATCH_UP, "catch_up_limit": 10},
            DuePlan(at(10, 21), skipped(*minutes_from(at(10, 0), 21)), None, None),
        ),
        # The cap boundary: 31 late fit in a limit of 31; a limit of 30 misses exactly one.
        ({"misfire_policy": MisfirePolicy.CATCH_UP, "catch_up_limit": 31}, DuePlan(at(10, 0), NO_SKIPS, None, None)),
        (
            {"misfire_policy": MisfirePolicy.CATCH_UP, "catch_up_limit": 30},
            DuePlan(at(10, 1), skipped(at(10, 0)), None, None),
        ),
    ],
)
def test_interval_outage_by_misfire_policy(fields: dict[str, Any], expected: DuePlan) -> None:
    rec = recurrence(every(60), **fields)
    assert plan_due(rec, at(10, 0), 0, OUTAGE_NOW) == expected


def test_skip_with_nothing_on_time_delivers_nothing_and_waits_for_the_next_fire_time() -> None:
    rec = recurrence(every(3600), misfire_policy=MisfirePolicy.SKIP)
    plan = plan_due(rec, at(10, 0), 0, at(12, 30))
    assert plan == DuePlan(None, skipped(at(10, 0), at(11, 0), at(12, 0)), at(13, 0), None)


# */15 down from 10:00 to 11:07: late fire times 10:00, 10:15, 10:30, 10:45, 11:00.
@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        # Grace 60 s (cutoff 11:06): none on time.
        (
            {"misfire_policy": MisfirePolicy.SKIP},
            DuePlan(None, skipped(at(10, 0), at(10, 15), at(10, 30), at(10, 45), at(11, 0)), at(11, 15), None),
        ),
        # Grace 10 min (cutoff 10:57): 11:00 is on time.
        (
            {"misfire_policy": MisfirePolicy.SKIP, "misfire_grace_s": 600.0},
            DuePlan(at(11, 0), skipped(at(10, 0), at(10, 15), at(10, 30), at(10, 45)), None, None),
        ),
        (
            {"misfire_policy": MisfirePolicy.FIRE_ONCE},
            DuePlan(at(11, 0), skipped(at(10, 0), at(10, 15), at(10, 30), at(10, 45)), None, None),
        ),
        ({"misfire_policy": MisfirePolicy.CATCH_UP, "catch_up_limit": 10}, DuePlan(at(10, 0), NO_SKIPS, None, None)),
        ({"misfire_policy": MisfirePolicy.CATCH_UP, "catch_up_limit": 5}, DuePlan(at(10, 0), NO_SKIPS, None, None)),
        (
            {"misfire_policy": MisfirePolicy.CATCH_UP, "catch_up_limit": 4},
            DuePlan(at(10, 15), skipped(at(10, 0)), None, None),
        ),
        (
            {"misfire_policy": MisfirePolicy.CATCH_UP, "catch_up_limit": 2},
            DuePlan(at(10, 45), skipped(at(10, 0), at(10, 15), at(10, 30)), None, None),
        ),
    ],
)
def test_cron_outage_by_misfire_policy(fields: dict[str, Any], expected: DuePlan) -> None:
    rec = recurrence(QUARTER_HOURLY, **fields)
    assert plan_due(rec, at(10, 0), 0, at(11, 7)) == expected


def test_a_year_of_daily_fire_times_is_counted_exactly() -> None:
    # 09:00 daily, down from 2025-01-01 09:00 to 2026-01-01 12:00: 366 late fire times
    # (365 in 2025, then 2026-01-01 09:00).
    daily = CronSchedule("0 9 * * *")
    once = plan_due(recurrence(daily), utc(2025, 1, 1, 9), 0, utc(2026, 1, 1, 12))
    assert once.deliver_at == utc(2026, 1, 1, 9)
    assert once.missed.total == 365 and not once.missed.truncated
    assert once.missed.times[:2] == (utc(2025, 1, 1, 9), utc(2025, 1, 2, 9))
    assert len(once.missed.times) == 100 and once.missed.times[-1] == utc(2025, 4, 10, 9)  # day 100 of 2025
    # The 10 latest are 2025-12-23 ... 2026-01-01; the other 356 are missed.
    catch_up = recurrence(daily, misfire_policy=MisfirePolicy.CATCH_UP, catch_up_limit=10)
    plan = plan_due(catch_up, utc(2025, 1, 1, 9), 0, utc(2026, 1, 1, 12))
    assert plan.deliver_at == utc(2025, 12, 23, 9)
    assert plan.missed.total == 356 and not plan.missed.truncated


# plan_due and bounds -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bounds", "runs_done", "scheduled_for", "expected"),
    [
        (Bounds(max_runs=5), 5, at(10, 0), DuePlan(None, NO_SKIPS, None, "max_runs")),
        (Bounds(max_runs=5), 4, at(10, 0), DuePlan(at(10, 0), NO_SKIPS, None, None)),
        (Bounds(end_at=at(9, 59)), 0, at(10, 0), DuePlan(None, NO_SKIPS, None, "end_at")),
        (Bounds(end_at=at(10, 0)), 0, at(10, 0), DuePlan(at(10, 0), NO_SKIPS, None, None)),
    ],
)
def test_plan_due_respects_bounds(
    bounds: Bounds, runs_done: int, scheduled_for: dt.datetime, expected: DuePlan
) -> None:
    rec = recurrence(every(60), bounds=bounds)
    assert plan_due(rec, scheduled_for, runs_done, at(10, 0, 30)) == expected


# The outage above with end_at 10:10:30: late fire times 10:00 ... 10:10 (11).
@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (
            {"misfire_policy": MisfirePolicy.FIRE_ONCE},
            DuePlan(at(10, 10), skipped(*minutes_from(at(10, 0), 10)), None, None),
        ),
        ({"misfire_policy": MisfirePolicy.SKIP}, DuePlan(None, skipped(*minutes_from(at(10, 0), 11)), None, "end_at")),
        (
            {"misfire_policy": MisfirePolicy.CATCH_UP, "catch_up_limit": 10},
            DuePlan(at(10, 1), skipped(at(10, 0)), None, None),
        ),
    ],
)
def test_end_at_caps_the_late_fire_times(fields: dict[str, Any], expected: DuePlan) -> None:
    rec = recurrence(every(60), bounds=Bounds(end_at=at(10, 10, 30)), **fields)
    assert plan_due(rec, at(10, 0), 0, OUTAGE_NOW) == expected


# Fixed rate vs fixed delay -------------------------------------------------------------------


def test_late_fire_times_follow_the_anchor_for_fixed_rate_and_the_occurrence_for_fixed_delay() -> None:
    # Every 10 min from 10:00. Fixed rate, due 10:10, claimed 10:40: 10:10, 10:20, 10:30, 10:40.
    fixed_rate = recurrence(every(600), at(10, 0))
    assert plan_due(fixed_rate, at(10, 10), 0, at(10, 40)) == DuePlan(
        at(10, 40), skipped(at(10, 10), at(10, 20), at(10, 30)), None, None
    )
    # Fixed delay, due 10:13 (a previous run finished 10:03): 10:13, 10:23, 10:33.
    fixed_delay = recurrence(every(600), at(10, 0), interval_mode=IntervalMode.FIXED_DELAY)
    assert plan_due(fixed_delay, at(10, 13), 0, at(10, 40)) == DuePlan(
        at(10, 33), skipped(at(10, 13), at(10, 23)), None, None
    )


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        # A 3-minute delivery does not move fixed-rate fire times ...
        (IntervalMode.FIXED_RATE, [at(10, 0), at(10, 10), at(10, 20), at(10, 30)]),
        # ... and pushes each fixed-delay one 3 minutes further.
        (IntervalMode.FIXED_DELAY, [at(10, 0), at(10, 13), at(10, 26), at(10, 39)]),
    ],
)
def test_slow_deliveries_shift_fixed_delay_not_fixed_rate(mode: IntervalMode, expected: list[dt.datetime]) -> None:
    rec = recurrence(every(600), at(10, 0), interval_mode=mode)
    occurrences = [at(10, 0)]
    for runs_done in (1, 2, 3):
        after = next_after_run(rec, occurrences[-1], occurrences[-1] + 3 * MINUTE, runs_done)
        assert after.next_at is not None and after.ended is None
        occurrences.append(after.next_at)
    assert occurrences == expected


# next_after_run: overlap -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schedule", "mode", "overlap", "finished_at", "expected"),
    [
        (
            every(600),
            IntervalMode.FIXED_RATE,
            OverlapPolicy.FORBID,
            at(10, 3),
            NextAfterRun(at(10, 10), None, NO_SKIPS),
        ),
        (
            every(600),
            IntervalMode.FIXED_DELAY,
            OverlapPolicy.FORBID,
            at(10, 3),
            NextAfterRun(at(10, 13), None, NO_SKIPS),
        ),
        # In flight until 10:25: 10:10 and 10:20 came due meanwhile.
        (
            every(600),
            IntervalMode.FIXED_RATE,
            OverlapPolicy.FORBID,
            at(10, 25),
            NextAfterRun(at(10, 30), None, skipped(at(10, 10), at(10, 20))),
        ),
        # Finishing exactly at a fire time: it came due while in flight.
        (
            every(600),
            IntervalMode.FIXED_RATE,
            OverlapPolicy.FORBID,
            at(10, 20),
            NextAfterRun(at(10, 30), None, skipped(at(10, 10), at(10, 20))),
        ),
        # ALLOW queues them: the next is 10:10, already due.
        (
            every(600),
            IntervalMode.FIXED_RATE,
            OverlapPolicy.ALLOW,
            at(10, 25),
            NextAfterRun(at(10, 10), None, NO_SKIPS),
        ),
        (
            every(600),
            IntervalMode.FIXED_DELAY,
            OverlapPolicy.ALLOW,
            at(10, 25),
            NextAfterRun(at(10, 35), None, NO_SKIPS),
        ),
        (
            EVERY_5_MIN_CRON,
            IntervalMode.FIXED_RATE,
            OverlapPolicy.FORBID,
            at(10, 12, 30),
            NextAfterRun(at(10, 15), None, skipped(at(10, 5), at(10, 10))),
        ),
        (
            EVERY_5_MIN_CRON,
            IntervalMode.FIXED_RATE,
            OverlapPolicy.ALLOW,
            at(10, 12, 30),
            NextAfterRun(at(10, 5), None, NO_SKIPS),
        ),
        (
            EVERY_5_MIN_CRON,
            IntervalMode.FIXED_RATE,
            OverlapPolicy.FORBID,
            at(10, 0, 40),
            NextAfterRun(at(10, 5), None, NO_SKIPS),
        ),
    ],
)
def test_next_after_run_overlap(
    schedule: CronSchedule | IntervalSchedule,
    mode: IntervalMode,
    overlap: OverlapPolicy,
    finished_at: dt.datetime,
    expected: NextAfterRun,
) -> None:
    rec = recurrence(schedule, at(10, 0), interval_mode=mode, overlap_policy=overlap)
    assert next_after_run(rec, at(10, 0), finished_at, 1) == expected


def test_only_allowed_overlap_on_a_fixed_grid_hands_occurrences_off() -> None:
    assert recurrence(every(600), overlap_policy=OverlapPolicy.ALLOW).hands_off_occurrences
    assert not recurrence(every(600), overlap_policy=OverlapPolicy.FORBID).hands_off_occurrences
    # A fixed-delay interval's next fire time waits for the previous one to finish.
    fixed_delay = recurrence(every(600), overlap_policy=OverlapPolicy.ALLOW, interval_mode=IntervalMode.FIXED_DELAY)
    assert not fixed_delay.hands_off_occurrences


def test_allow_goes_on_from_the_occurrence_and_plan_due_then_applies_the_misfire_policy() -> None:
    rec = recurrence(every(600), at(10, 0), overlap_policy=OverlapPolicy.ALLOW)
    after = next_after_run(rec, at(10, 0), at(10, 25), 1)
    assert after == NextAfterRun(at(10, 10), None, NO_SKIPS)
    # Claimed at once, 15 min late: FIRE_ONCE delivers the most recent one, 10:20.
    assert plan_due(rec, at(10, 10), 1, at(10, 25)) == DuePlan(at(10, 20), skipped(at(10, 10)), None, None)


def test_a_backlog_due_before_the_claim_is_not_an_overlap() -> None:
    rec = recurrence(every(60), overlap_policy=OverlapPolicy.FORBID)
    # A catch-up delivery of 10:00, claimed at 10:30:30: 10:01 ... 10:30 were already due.
    assert next_after_run(rec, at(10, 0), at(10, 30, 31), 1, claimed_at=at(10, 30, 30)) == NextAfterRun(
        at(10, 1), None, NO_SKIPS
    )
    # Without claimed_at the occurrence counts as in flight since 10:00.
    assert next_after_run(rec, at(10, 0), at(10, 30, 31), 1) == NextAfterRun(
        at(10, 31), None, skipped(*minutes_from(at(10, 1), 30))
    )
    # Claimed on time (10:00:20), in flight until 10:03:30: 10:01, 10:02, 10:03 overlapped.
    assert next_after_run(rec, at(10, 0), at(10, 3, 30), 1, claimed_at=at(10, 0, 20)) == NextAfterRun(
        at(10, 4), None, skipped(at(10, 1), at(10, 2), at(10, 3))
    )


@pytest.mark.parametrize(
    ("policy", "delivered", "missed_total"),
    [
        (MisfirePolicy.CATCH_UP, list(minutes_from(at(10, 21), 10)), 21),
        (MisfirePolicy.FIRE_ONCE, [at(10, 30)], 30),
        (MisfirePolicy.SKIP, [at(10, 30)], 30),
    ],
)
def test_recovering_from_an_outage_end_to_end(
    policy: MisfirePolicy, delivered: list[dt.datetime], missed_total: int
) -> None:
    """The scheduler's loop after the outage above, each delivery taking 1 s, FORBID overlap."""
    rec = recurrence(every(60), misfire_policy=policy, catch_up_limit=10)
    scheduled_for: dt.datetime | None = at(10, 0)
    now = OUTAGE_NOW
    seen: list[dt.datetime] = []
    missed = 0
    runs_done = 0
    for _ in range(50):
        assert scheduled_for is not None
        if scheduled_for > now:
            break
        plan = plan_due(rec, scheduled_for, runs_done, now)
        missed += plan.missed.total
        assert plan.deliver_at is not None
        seen.append(plan.deliver_at)
        runs_done += 1
        after = next_after_run(rec, plan.deliver_at, now + SECOND, runs_done, claimed_at=now)
        assert after.overlapped == NO_SKIPS
        scheduled_for, now = after.next_at, now + 2 * SECOND
    assert seen == delivered
    assert missed == missed_total
    assert scheduled_for == at(10, 31)


# next_after_run: bounds -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "bounds", "runs_done", "finished_at", "expected"),
    [
        (IntervalMode.FIXED_RATE, Bounds(max_runs=3), 3, at(10, 1), NextAfterRun(None, "max_runs", NO_SKIPS)),
        (IntervalMode.FIXED_DELAY, Bounds(max_runs=3), 3, at(10, 1), NextAfterRun(None, "max_runs", NO_SKIPS)),
        (IntervalMode.FIXED_RATE, Bounds(max_runs=3), 2, at(10, 1), NextAfterRun(at(10, 10), None, NO_SKIPS)),
        (IntervalMode.FIXED_RATE, Bounds(end_at=at(10, 9, 59)), 1, at(10, 1), NextAfterRun(None, "end_at", NO_SKIPS)),
        (IntervalMode.FIXED_RATE, Bounds(end_at=at(10, 10)), 1, at(10, 1), NextAfterRun(at(10, 10), None, NO_SKIPS)),
        (IntervalMode.FIXED_DELAY, Bounds(end_at=at(10, 12)), 1, at(10, 3), NextAfterRun(None, "end_at", NO_SKIPS)),
        # Overlapped fire times stop at end_at too.
        (
            IntervalMode.FIXED_RATE,
            Bounds(end_at=at(10, 15)),
            1,
            at(10, 25),
            NextAfterRun(None, "end_at", skipped(at(10, 10))),
        ),
    ],
)
def test_next_after_run_respects_bounds(
    mode: IntervalMode, bounds: Bounds, runs_done: int, finished_at: dt.datetime, expected: NextAfterRun
) -> None:
    rec = recurrence(every(600), at(10, 0), interval_mode=mode, bounds=bounds)
    assert next_after_run(rec, at(10, 0), finished_at, runs_done) == expected


# Huge outages stay bounded -------------------------------------------------------------------

# Down for all of 2025 (not a leap year): 365 * 86400 = 31,536,000 seconds.
YEAR_START = utc(2025, 1, 1)
YEAR_END = utc(2026, 1, 1)
FIRST_100_SECONDS = tuple(YEAR_START + index * SECOND for index in range(100))


@pytest.mark.parametrize(
    ("fields", "deliver_at", "missed_total"),
    [
        # Grace 60 s: 2025-12-31 23:59:00 is the earliest on-time fire time.
        ({"misfire_policy": MisfirePolicy.SKIP}, utc(2025, 12, 31, 23, 59, 0), 31_536_000 - 60),
        ({"misfire_policy": MisfirePolicy.FIRE_ONCE}, YEAR_END, 31_536_000),
        # 31,536,001 late (both ends); the 10 latest start at 23:59:51.
        (
            {"misfire_policy": MisfirePolicy.CATCH_UP, "catch_up_limit": 10},
            utc(2025, 12, 31, 23, 59, 51),
            31_536_001 - 10,
        ),
    ],
)
def test_one_second_interval_down_for_a_year_is_counted_exactly_and_quickly(
    fields: dict[str, Any], deliver_at: dt.datetime, missed_total: int
) -> None:
    rec = recurrence(every(1), YEAR_START, **fields)
    plan = plan_due(rec, YEAR_START, 0, YEAR_END)
    assert plan == DuePlan(deliver_at, Skipped(FIRST_100_SECONDS, missed_total, truncated=False), None, None)


@pytest.mark.parametrize(
    ("fields", "deliver_at"),
    [
        ({"misfire_policy": MisfirePolicy.SKIP}, utc(2025, 12, 31, 23, 59, 0)),
        ({"misfire_policy": MisfirePolicy.FIRE_ONCE}, YEAR_END),
        ({"misfire_policy": MisfirePolicy.CATCH_UP, "catch_up_limit": 10}, utc(2025, 12, 31, 23, 59, 51)),
    ],
)
def test_every_second_cron_down_for_a_year_decides_exactly_and_flags_the_count(
    fields: dict[str, Any], deliver_at: dt.datetime
) -> None:
    rec = recurrence(EVERY_SECOND_CRON, YEAR_START, **fields)
    plan = plan_due(rec, YEAR_START, 0, YEAR_END)
    assert plan.deliver_at == deliver_at and plan.next_at is None and plan.ended is None
    assert plan.missed.times == FIRST_100_SECONDS
    # Too many to count: a lower bound, flagged.
    assert plan.missed.truncated
    assert 100 <= plan.missed.total < 31_536_000


def test_every_second_cron_in_flight_for_a_year_is_bounded() -> None:
    rec = recurrence(EVERY_SECOND_CRON, YEAR_START, overlap_policy=OverlapPolicy.FORBID)
    after = next_after_run(rec, YEAR_START, YEAR_END + dt.timedelta(milliseconds=500), 1)
    assert after.next_at == YEAR_END + SECOND
    assert after.overlapped.times == tuple(YEAR_START + index * SECOND for index in range(1, 101))
    assert after.overlapped.truncated


# DST (America/New_York, 01:30 daily) --------------------------------------------------------


def test_outage_across_fall_back_fires_the_repeated_hour_once() -> None:
    # Down from Sat 2026-10-31 01:30 EDT (05:30Z) to Mon 2026-11-02 12:00Z. Late fire times:
    # 10-31 05:30Z, 11-01 05:30Z (01:30 EDT; not again at 01:30 EST), 11-02 06:30Z (01:30 EST).
    once = recurrence(NEW_YORK_0130)
    assert plan_due(once, utc(2026, 10, 31, 5, 30), 0, utc(2026, 11, 2, 12)) == DuePlan(
        utc(2026, 11, 2, 6, 30), skipped(utc(2026, 10, 31, 5, 30), utc(2026, 11, 1, 5, 30)), None, None
    )
    catch_up = recurrence(NEW_YORK_0130, misfire_policy=MisfirePolicy.CATCH_UP, catch_up_limit=2)
    assert plan_due(catch_up, utc(2026, 10, 31, 5, 30), 0, utc(2026, 11, 2, 12)) == DuePlan(
        utc(2026, 11, 1, 5, 30), skipped(utc(2026, 10, 31, 5, 30)), None, None
    )


@pytest.mark.parametrize(
    ("occurrence_at", "expected"),
    [
        # Fall back: 25 hours to the next 01:30 (EST), not 24.
        (utc(2026, 11, 1, 5, 30), utc(2026, 11, 2, 6, 30)),
        # Spring forward: 23 hours from 01:30 EST to 01:30 EDT.
        (utc(2026, 3, 8, 6, 30), utc(2026, 3, 9, 5, 30)),
    ],
)
def test_next_after_run_across_dst(occurrence_at: dt.datetime, expected: dt.datetime) -> None:
    rec = recurrence(NEW_YORK_0130, occurrence_at)
    assert next_after_run(rec, occurrence_at, occurrence_at + 10 * SECOND, 1) == NextAfterRun(expected, None, NO_SKIPS)
