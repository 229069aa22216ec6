"""Schedule health's rules (app/domain/health.py) as a table: thresholds from the job, else
its tenant, else the settings; the failing verdict; lateness; and the health a job shows,
`paused` > `failing` > `late` > `healthy` / `unknown`, finished jobs apart."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from app.domain.health import (
    Health,
    HealthDefaults,
    HealthFacts,
    Thresholds,
    classify,
    is_failing,
    is_late,
    shown_health,
    thresholds,
    watch_verdict,
)
from app.domain.states import JobState

NOW = dt.datetime(2027, 7, 15, 12, 0, tzinfo=dt.UTC)
S = dt.timedelta(seconds=1)
ONE = Thresholds(max_consecutive_failures=1, success_within_s=None)
HELD = dt.datetime.max  # 'infinity' as asyncpg reads it (naive)


def facts(**changes: object) -> HealthFacts:
    """A scheduled job created a day ago, its next fire time ahead, nothing settled yet."""
    base = HealthFacts(state=JobState.SCHEDULED, created_at=NOW - 86400 * S, run_at=NOW + 30 * S)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("job", "tenant", "defaults", "recurring", "expected"),
    [
        ((None, None), (None, None), HealthDefaults(), True, Thresholds(1, None)),
        ((600, None), (None, 5), HealthDefaults(), True, Thresholds(5, 600)),
        ((None, 2), (3600, 5), HealthDefaults(3, 60), True, Thresholds(2, 3600)),
        ((None, None), (None, None), HealthDefaults(4, 60), True, Thresholds(4, 60)),
        # A one-off keeps no schedule: no deadline, whoever sets one.
        ((None, None), (3600, None), HealthDefaults(1, 60), False, Thresholds(1, None)),
    ],
)
def test_each_threshold_is_the_jobs_else_the_tenants_else_the_settings(
    job: tuple[int | None, int | None],
    tenant: tuple[int | None, int | None],
    defaults: HealthDefaults,
    recurring: bool,
    expected: Thresholds,
) -> None:
    assert thresholds(job=job, tenant=tenant, defaults=defaults, recurring=recurring) == expected


@pytest.mark.parametrize(
    ("record", "limits", "failing"),
    [
        (facts(), ONE, False),
        (facts(consecutive_failures=1), ONE, True),
        (facts(consecutive_failures=2), Thresholds(3, None), False),
        (facts(consecutive_failures=3), Thresholds(3, None), True),
        # No success within 600 s of the last one...
        (facts(last_success_at=NOW - 601 * S), Thresholds(1, 600), True),
        (facts(last_success_at=NOW - 599 * S), Thresholds(1, 600), False),
        # ...or of its creation, when none succeeded yet.
        (facts(created_at=NOW - 601 * S), Thresholds(1, 600), True),
        (facts(created_at=NOW - 60 * S), Thresholds(1, 600), False),
        # A success ends a streak: the counters say so (consecutive_failures back to 0).
        (facts(last_success_at=NOW - S, last_failure_at=NOW - 2 * S), ONE, False),
    ],
)
def test_failing_is_a_streak_at_its_threshold_or_a_missed_deadline(
    record: HealthFacts, limits: Thresholds, failing: bool
) -> None:
    assert is_failing(record, limits, NOW) is failing


@pytest.mark.parametrize(
    ("record", "late"),
    [
        (facts(run_at=NOW - 59 * S), False),  # within the default 60 s grace
        (facts(run_at=NOW - 61 * S), True),
        (facts(run_at=NOW - 11 * S, misfire_grace_s=10), True),
        (facts(state=JobState.RETRYING, run_at=NOW - 61 * S), True),
        (facts(state=JobState.RUNNING, run_at=None), False),
        (facts(run_at=None), False),  # a chained job waits for its parent
        (facts(run_at=HELD, held=True), False),  # held while its target is paused
    ],
)
def test_late_is_an_occurrence_waiting_past_its_grace(record: HealthFacts, late: bool) -> None:
    assert is_late(record, NOW) is late


LATE = NOW - 120 * S


@pytest.mark.parametrize(
    ("record", "shown"),
    [
        (facts(), Health.UNKNOWN),
        (facts(last_success_at=NOW - S), Health.HEALTHY),
        # Failures below the threshold, nothing succeeded yet: not known to work.
        (facts(consecutive_failures=1, last_failure_at=NOW - S), Health.UNKNOWN),
        (facts(last_success_at=NOW - S, run_at=LATE), Health.LATE),
        (facts(alerted=True), Health.FAILING),
        (facts(alerted=True, run_at=LATE), Health.FAILING),
        (facts(state=JobState.PAUSED, run_at=None, alerted=True), Health.PAUSED),
        (facts(target_paused=True, run_at=LATE), Health.PAUSED),
        (facts(held=True, run_at=HELD), Health.PAUSED),
        # Finished: how it ended.
        (facts(state=JobState.SUCCEEDED, run_at=None, last_success_at=NOW - S), Health.HEALTHY),
        (facts(state=JobState.CANCELLED, run_at=None), Health.UNKNOWN),
        (facts(state=JobState.CANCELLED, run_at=None, alerted=True, target_paused=True), Health.FAILING),
        (facts(state=JobState.DEAD, run_at=None, consecutive_failures=1), Health.FAILING),
    ],
)
def test_shown_health_puts_paused_before_failing_before_late(record: HealthFacts, shown: Health) -> None:
    assert shown_health(record, NOW) == shown


@pytest.mark.parametrize(
    ("record", "verdict"),
    [
        (facts(consecutive_failures=1), True),
        (facts(alerted=True, last_success_at=NOW - S), False),
        # Paused: the verdict waits for the resume, whatever the record says.
        (facts(state=JobState.PAUSED, consecutive_failures=5), None),
        (facts(target_paused=True, alerted=True), None),
    ],
)
def test_the_watch_records_no_verdict_while_a_job_is_paused(record: HealthFacts, verdict: bool | None) -> None:
    assert watch_verdict(record, ONE, NOW) is verdict


def test_classify_is_the_health_shown_once_the_watch_has_looked() -> None:
    assert classify(facts(consecutive_failures=1), ONE, NOW) == Health.FAILING
    assert classify(facts(alerted=True, last_success_at=NOW - S), ONE, NOW) == Health.HEALTHY
    assert classify(facts(state=JobState.PAUSED, consecutive_failures=1), ONE, NOW) == Health.PAUSED
    # A finished job is not watched: its recorded verdict stands.
    ended = facts(state=JobState.SUCCEEDED, run_at=None, consecutive_failures=1)
    assert classify(ended, ONE, NOW) == Health.UNKNOWN
