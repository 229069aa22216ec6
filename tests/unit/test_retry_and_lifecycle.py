"""Retry backoff and the after-attempt decision, as pure functions."""

from __future__ import annotations

import datetime as dt
import random

import pytest

from app.domain.lifecycle import AttemptContext, after_attempt
from app.domain.occurrences import Recurrence
from app.domain.retry import (
    MAX_RETRY_AFTER_S,
    RetryPolicy,
    attempts_exhausted,
    backoff_ceiling,
    backoff_delay,
    is_retryable_status,
    parse_retry_after,
)
from app.domain.schedule import CronSchedule, IntervalSchedule, OnceSchedule, Schedule
from app.domain.states import JobState

POLICY = RetryPolicy(max_attempts=4, backoff_base_s=2.0, backoff_max_s=10.0)
NOW = dt.datetime(2026, 3, 1, 12, 0, 30, tzinfo=dt.UTC)


@pytest.mark.parametrize(("attempt", "ceiling"), [(1, 2.0), (2, 4.0), (3, 8.0), (4, 10.0), (50, 10.0), (10_000, 10.0)])
def test_backoff_ceiling_doubles_and_caps(attempt: int, ceiling: float) -> None:
    assert backoff_ceiling(POLICY, attempt) == ceiling


def test_full_jitter_stays_within_zero_and_the_ceiling_and_spreads() -> None:
    rng = random.Random(7)
    delays = [backoff_delay(POLICY, 3, rng) for _ in range(2000)]
    assert all(0.0 <= d <= 8.0 for d in delays)
    # Full jitter: spread over the whole range, not clustered at the ceiling.
    assert min(delays) < 1.0 and max(delays) > 7.0


def test_attempts_exhausted_at_max() -> None:
    assert not attempts_exhausted(POLICY, 3)
    assert attempts_exhausted(POLICY, 4)


def ctx(schedule: Schedule, attempt: int) -> AttemptContext:
    occurrence = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
    recurrence = None if isinstance(schedule, OnceSchedule) else Recurrence(schedule, occurrence)
    return AttemptContext(occurrence, attempt, POLICY, recurrence=recurrence)


ONCE = OnceSchedule(dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC))
CRON = CronSchedule("*/5 * * * *", "UTC")
EVERY = IntervalSchedule(60)


def test_one_off_success_ends_succeeded() -> None:
    step = after_attempt(ctx(ONCE, 1), True, NOW, random.Random(1))
    assert step.state == JobState.SUCCEEDED and not step.dead_letter


def test_failure_with_attempts_left_retries_with_backoff() -> None:
    step = after_attempt(ctx(ONCE, 2), False, NOW, random.Random(1))
    assert step.state == JobState.RETRYING
    assert step.retry_delay_s is not None and 0 <= step.retry_delay_s <= 4.0
    assert not step.dead_letter


def test_one_off_out_of_attempts_is_dead_lettered() -> None:
    step = after_attempt(ctx(ONCE, 4), False, NOW, random.Random(1))
    assert step.state == JobState.DEAD and step.dead_letter


def test_recurring_success_schedules_the_next_occurrence() -> None:
    step = after_attempt(ctx(CRON, 1), True, NOW, random.Random(1))
    assert step.state == JobState.SCHEDULED
    assert step.next_occurrence_at == dt.datetime(2026, 3, 1, 12, 5, tzinfo=dt.UTC)
    step = after_attempt(ctx(EVERY, 1), True, NOW, random.Random(1))
    assert step.next_occurrence_at == dt.datetime(2026, 3, 1, 12, 1, tzinfo=dt.UTC)


def test_recurring_out_of_attempts_dead_letters_the_occurrence_and_keeps_its_schedule() -> None:
    step = after_attempt(ctx(CRON, 4), False, NOW, random.Random(1))
    assert step.state == JobState.SCHEDULED and step.dead_letter
    assert step.next_occurrence_at == dt.datetime(2026, 3, 1, 12, 5, tzinfo=dt.UTC)


def test_a_schedule_with_no_fire_time_left_completes_instead_of_raising() -> None:
    # A stored schedule that can no longer fire must not leave its job running forever.
    never = CronSchedule("0 0 30 2 *", "UTC")
    ended = after_attempt(ctx(never, 1), True, NOW, random.Random(1))
    assert ended.state == JobState.SUCCEEDED and ended.schedule_ended
    # Its last occurrence out of attempts: that occurrence is dead-lettered, and the schedule
    # still ends succeeded with its ended_reason (README: a schedule past its bounds succeeds).
    step = after_attempt(ctx(never, 4), False, NOW, random.Random(1))
    assert step.state == JobState.SUCCEEDED and step.dead_letter and step.schedule_ended


@pytest.mark.parametrize(
    ("status", "retryable"),
    [
        *[(status, True) for status in (500, 502, 503, 599, 408, 425, 429, 302)],
        *[(status, False) for status in (400, 401, 403, 404, 410, 422)],
    ],
)
def test_which_statuses_are_retried(status: int, retryable: bool) -> None:
    assert is_retryable_status(status) is retryable


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, None),
        ("120", 120.0),
        (" 7 ", 7.0),
        ("999999", MAX_RETRY_AFTER_S),
        ("Sun, 01 Mar 2026 12:01:00 GMT", 30.0),  # NOW is 12:00:30
        ("Sun, 01 Mar 2026 11:00:00 GMT", 0.0),  # in the past: no extra wait
        ("-5", None),
        ("soon", None),
        ("", None),
    ],
)
def test_retry_after_seconds_and_http_dates(header: str | None, expected: float | None) -> None:
    assert parse_retry_after(header, NOW) == expected


def test_non_retryable_failure_dead_letters_on_the_first_attempt() -> None:
    step = after_attempt(ctx(ONCE, 1), False, NOW, random.Random(1), retryable=False)
    assert step.state == JobState.DEAD and step.dead_letter
    step = after_attempt(ctx(CRON, 1), False, NOW, random.Random(1), retryable=False)
    assert step.state == JobState.SCHEDULED and step.dead_letter


def test_retry_after_lengthens_but_never_shortens_the_backoff() -> None:
    long_wait = after_attempt(ctx(ONCE, 1), False, NOW, random.Random(1), retry_after_s=90.0)
    assert long_wait.retry_delay_s == 90.0
    # Attempt 4 of a 5-attempt policy: ceiling 10 s; a 0 s Retry-After keeps the jittered delay.
    policy_ctx = AttemptContext(NOW, 1, RetryPolicy(5, 8.0, 10.0))
    short = after_attempt(policy_ctx, False, NOW, random.Random(3), retry_after_s=0.0)
    plain = after_attempt(policy_ctx, False, NOW, random.Random(3))
    assert short.retry_delay_s == plain.retry_delay_s


def test_backoff_factor_shapes_the_ceiling() -> None:
    triple = RetryPolicy(max_attempts=9, backoff_base_s=1.0, backoff_max_s=100.0, backoff_factor=3.0)
    assert [backoff_ceiling(triple, n) for n in (1, 2, 3, 4, 5)] == [1.0, 3.0, 9.0, 27.0, 81.0]
    assert backoff_ceiling(triple, 6) == 100.0
    flat = RetryPolicy(max_attempts=9, backoff_base_s=5.0, backoff_max_s=100.0, backoff_factor=1.0)
    assert {backoff_ceiling(flat, n) for n in range(1, 50)} == {5.0}
    steep = RetryPolicy(max_attempts=9, backoff_base_s=1.0, backoff_max_s=60.0, backoff_factor=10.0)
    assert backoff_ceiling(steep, 10_000) == 60.0  # no overflow


def test_a_target_override_replaces_the_default_retryable_set() -> None:
    assert is_retryable_status(404, frozenset({404}))
    assert not is_retryable_status(500, frozenset({404}))
    assert not is_retryable_status(503, frozenset())
