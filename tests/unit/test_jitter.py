"""Per-occurrence jitter (app/domain/schedule.py): the delay's bounds, that it is the same
wherever and whenever it is computed, its spread, the jitter a schedule allows, and that a
jittered occurrence is judged late from its own fire time (app/domain/occurrences.py)."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest

from app.domain.occurrences import MisfirePolicy, Recurrence, plan_due
from app.domain.schedule import (
    MAX_JITTER_S,
    CronSchedule,
    IntervalSchedule,
    ScheduleError,
    jitter_delay,
    jittered,
    max_jitter_s,
)

UTC = dt.UTC
NOW = dt.datetime(2026, 11, 27, 12, 0, tzinfo=UTC)


def test_the_delay_lies_within_the_bound_and_is_drawn_per_occurrence() -> None:
    job = uuid.UUID(int=7)
    delays = [jitter_delay(job, NOW + dt.timedelta(minutes=k), 30) for k in range(2000)]
    assert all(dt.timedelta(0) <= d <= dt.timedelta(seconds=30) for d in delays)
    # Spread over the window: every 3-second tenth of it is used, none holds twice its share.
    tenths = [int(d.total_seconds() // 3) for d in delays]
    counts = [tenths.count(k) for k in range(10)]
    assert min(counts) > 0 and max(counts) < 2 * 2000 / 10, counts


def test_the_delay_depends_only_on_the_job_and_the_occurrence() -> None:
    job, other = uuid.UUID(int=1), uuid.UUID(int=2)
    at = NOW + dt.timedelta(hours=3)
    assert jitter_delay(job, at, 600) == jitter_delay(job, at.astimezone(dt.timezone(dt.timedelta(hours=5))), 600)
    # Two jobs on one schedule do not fire together.
    times = [at + dt.timedelta(hours=k) for k in range(100)]
    assert sum(jitter_delay(job, t, 600) != jitter_delay(other, t, 600) for t in times) >= 95
    assert jitter_delay(job, at, 0) == dt.timedelta(0)
    assert jittered(job, at, 0) == at
    assert jittered(job, at, 600) == at + jitter_delay(job, at, 600)


@pytest.mark.parametrize(
    ("schedule", "most"),
    [
        (IntervalSchedule(60), 30),
        (IntervalSchedule(86_400), MAX_JITTER_S),
        (CronSchedule("*/10 * * * *"), 300),
        (CronSchedule("0 9 * * 1-5"), MAX_JITTER_S),
        (CronSchedule("*/20 * * * * *"), 10),
        # Its shortest gap (the repeated hour of a fall-back night aside): 15 minutes.
        (CronSchedule("0,15 * * * *"), 450),
    ],
)
def test_a_schedule_allows_half_its_shortest_period_at_most_an_hour(
    schedule: CronSchedule | IntervalSchedule, most: int
) -> None:
    assert max_jitter_s(schedule, NOW) == most


def test_a_recurrence_refuses_jitter_out_of_range() -> None:
    with pytest.raises(ScheduleError) as refused:
        Recurrence(IntervalSchedule(60), anchor=NOW, jitter_s=MAX_JITTER_S + 1)
    assert refused.value.field == "jitter_s"


def test_a_jittered_occurrence_is_late_only_past_the_grace_of_its_own_fire_time() -> None:
    rec = Recurrence(
        IntervalSchedule(600), anchor=NOW, misfire_policy=MisfirePolicy.SKIP, misfire_grace_s=5, jitter_s=300
    )
    delay = dt.timedelta(seconds=200)
    # Claimed 203 s after the nominal time: 3 s after its fire time, on time.
    plan = plan_due(rec, NOW, 0, NOW + dt.timedelta(seconds=203), delay)
    assert plan.deliver_at == NOW and plan.missed.total == 0
    # Without its delay it would have been missed.
    assert plan_due(rec, NOW, 0, NOW + dt.timedelta(seconds=203)).deliver_at is None
    # 10 s past its fire time: late, and the policy applies to the nominal fire times.
    late = plan_due(rec, NOW, 0, NOW + dt.timedelta(seconds=210), delay)
    assert late.deliver_at is None and late.missed.total == 1
