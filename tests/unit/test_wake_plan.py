"""When an idle scheduler claims again: after a claim that drained its horizon, when the next
due job is half the claim-ahead away (each claim of a steady stream takes half a horizon's
worth, every job still claimed ahead of its due time); never later than a poll interval."""

from __future__ import annotations

import asyncio
import datetime as dt
import time

import pytest

from app.domain.db_clock import DbClock
from app.services.wake_plan import WakePlan

NOW = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)


def _plan() -> WakePlan:
    """A plan whose clock has one reading: the database's clock is NOW as the test starts."""
    clock = DbClock()
    clock.observe(time.monotonic(), NOW)
    return WakePlan(asyncio.Event(), clock, ahead_s=0.05)


def test_after_a_drained_claim_it_wakes_when_the_next_job_is_half_the_horizon_away() -> None:
    plan = _plan()
    plan.note_next_due(NOW + dt.timedelta(seconds=1.0))
    # 1 s to the next due job, claimed 25 ms ahead of it (a little less as the test runs).
    assert plan.wait_s(poll_interval_s=5.0) == pytest.approx(0.975, abs=0.01)


def test_a_job_due_within_half_the_horizon_is_claimed_at_once() -> None:
    plan = _plan()
    plan.note_next_due(NOW + dt.timedelta(seconds=0.02))
    assert plan.wait_s(poll_interval_s=5.0) == 0.0


def test_nothing_due_soon_waits_one_poll_interval() -> None:
    plan = _plan()
    plan.note_next_due(NOW + dt.timedelta(hours=1))
    assert plan.wait_s(poll_interval_s=2.0) == 2.0
    plan.forget_next_due()  # a claim that found nothing due ahead
    plan.note_next_due(None)
    assert plan.wait_s(poll_interval_s=2.0) == 2.0
