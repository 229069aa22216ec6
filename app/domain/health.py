"""Schedule health: whether a job's schedule is working, as one word. Pure rules, `now`
passed in; app/store/health.py writes the same rules in SQL (the health watch's edges, the
jobs list's `?health=` filter and the gauge), and tests/unit/test_health.py holds both to
one table.

Two questions, answered apart:
- **Is it failing?** (`is_failing`, against the job's thresholds): `consecutive_failures`
  reached `max_consecutive_failures`, or a recurring job with `success_within_s` had no
  success within it (counted from its last success, or from its creation). Failed
  occurrences are the dead-lettered ones and fire times the misfire policy gave up; the
  counters are kept by the outcome statement and the misfire settle. The health watch
  (app/services/health_watch.py) asks it each reaper pass and records the answer in
  `health_alert` as it reports the edge (job.health.failing / job.health.recovered).
- **What does it show?** (`shown_health`): the answer recorded by the watch, so the API,
  the console, the gauge and the events a tenant receives always agree, in this order:
  `paused` (the job is paused, or its target or tenant is) > `failing` > `late` (an
  occurrence is waiting past its fire time plus its misfire grace, a held one aside) >
  `healthy` (an occurrence succeeded) / `unknown` (none has yet).

A finished job is no longer watched: it shows how it ended, `failing` if it ended while
failing (or is a one-off that was dead-lettered), else `healthy` if an occurrence succeeded,
else `unknown`. It is never `late` or `paused`, and no deadline runs for it.

Thresholds: the job's own `expect`, else its tenant's defaults (tenant_limits), else the
settings' (HealthDefaults). `success_within_s` applies to recurring jobs only.
"""

from __future__ import annotations

import datetime as dt
import enum
from dataclasses import dataclass, replace

from app.domain.states import CLAIMABLE_STATES, TERMINAL_STATES, JobState

# jobs.health_alert while a job.health.failing event stands unanswered by a recovered one.
ALERT_FAILING = "failing"


class Health(enum.StrEnum):
    HEALTHY = "healthy"
    LATE = "late"
    FAILING = "failing"
    PAUSED = "paused"
    UNKNOWN = "unknown"


# A tenant's defaults for its jobs' thresholds (tenant_limits), as the admin API names them.
TENANT_DEFAULT_FIELDS = ("expect_success_within_s", "expect_max_consecutive_failures")


@dataclass(frozen=True)
class HealthDefaults:
    """The settings' thresholds, for jobs (and tenants) that set none."""

    max_consecutive_failures: int = 1
    success_within_s: int | None = None


@dataclass(frozen=True)
class Expect:
    """A recurring job's own `expect`: either threshold may be left to its tenant's default."""

    success_within_s: int | None = None
    max_consecutive_failures: int | None = None


@dataclass(frozen=True)
class Thresholds:
    """One job's thresholds, resolved: when it counts as failing."""

    max_consecutive_failures: int
    success_within_s: int | None


def thresholds(
    *,
    job: tuple[int | None, int | None],
    tenant: tuple[int | None, int | None],
    defaults: HealthDefaults,
    recurring: bool,
) -> Thresholds:
    """Each threshold from the first that sets it: the job's own `expect`, its tenant's,
    the settings'. `job` and `tenant` are (success_within_s, max_consecutive_failures)."""
    within = _first(job[0], tenant[0], defaults.success_within_s)
    most = _first(job[1], tenant[1], defaults.max_consecutive_failures)
    assert most is not None
    # A one-off (or chained) job has no schedule to keep: only its failures count.
    return Thresholds(most, within if recurring else None)


def _first(*values: int | None) -> int | None:
    return next((value for value in values if value is not None), None)


@dataclass(frozen=True)
class HealthFacts:
    """What health reads of a job (its row, and whether its target or tenant is paused)."""

    state: JobState
    created_at: dt.datetime
    consecutive_failures: int = 0
    last_success_at: dt.datetime | None = None
    last_failure_at: dt.datetime | None = None
    # When the job may next be claimed (fire time or retry), and its grace for lateness.
    run_at: dt.datetime | None = None
    misfire_grace_s: float = 60.0
    # A held occurrence (its target or tenant paused) waits for the resume: never late.
    held: bool = False
    # Its target, or its tenant, is paused.
    target_paused: bool = False
    # The watch's last answer (jobs.health_alert): failing was reported, recovered not yet.
    alerted: bool = False
    # When a deliberate pause of it last ended: a success deadline counts from then too.
    resumed_at: dt.datetime | None = None


def is_paused(facts: HealthFacts) -> bool:
    """Paused by a user or an operator: the job, its target or its tenant. A paused job does
    not become failing (nor recover) while so."""
    return facts.state == JobState.PAUSED or facts.target_paused or facts.held


def is_failing(facts: HealthFacts, limits: Thresholds, now: dt.datetime) -> bool:
    """The thresholds' verdict on the job's record (pause aside: see is_paused)."""
    if facts.consecutive_failures >= limits.max_consecutive_failures:
        return True
    if limits.success_within_s is None:
        return False
    since = max(moment for moment in (facts.last_success_at, facts.created_at, facts.resumed_at) if moment is not None)
    return since + dt.timedelta(seconds=limits.success_within_s) < now


def is_late(facts: HealthFacts, now: dt.datetime) -> bool:
    """An occurrence waits past its time plus its grace. A held one's run_at is 'infinity'
    (read as a naive datetime.max), which is never late."""
    run_at = facts.run_at
    if facts.state not in CLAIMABLE_STATES or run_at is None or facts.held or run_at.tzinfo is None:
        return False
    return run_at < now - dt.timedelta(seconds=facts.misfire_grace_s)


def watch_verdict(facts: HealthFacts, limits: Thresholds, now: dt.datetime) -> bool | None:
    """What the health watch records for an unfinished job: True (failing), False (not), or
    None while it is paused (its alert, set or not, stands until it is resumed)."""
    if is_paused(facts):
        return None
    return is_failing(facts, limits, now)


def shown_health(facts: HealthFacts, now: dt.datetime) -> Health:
    """The job's health as shown (module docstring): `failing` is the watch's recorded verdict."""
    if facts.state in TERMINAL_STATES:
        if facts.alerted or facts.state == JobState.DEAD:
            return Health.FAILING
        return Health.HEALTHY if facts.last_success_at is not None else Health.UNKNOWN
    if is_paused(facts):
        return Health.PAUSED
    if facts.alerted:
        return Health.FAILING
    if is_late(facts, now):
        return Health.LATE
    return Health.HEALTHY if facts.last_success_at is not None else Health.UNKNOWN


def classify(facts: HealthFacts, limits: Thresholds, now: dt.datetime) -> Health:
    """The health the job shows once the watch has looked at it at `now`: its verdict
    recorded, then shown_health. (The reference the SQL of app/store/health.py follows.)"""
    if facts.state not in TERMINAL_STATES:
        verdict = watch_verdict(facts, limits, now)
        if verdict is not None:
            facts = replace(facts, alerted=verdict)
    return shown_health(facts, now)
