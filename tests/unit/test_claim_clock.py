"""A job claimed ahead waits for its due time on the database's clock as the claim sent its
row: a claim's own duration is not added to the wait, and the wait still never ends early."""

from __future__ import annotations

import datetime as dt
import types
import uuid

import pytest

from app.domain.job import ClaimedJob
from app.domain.retry import RetryPolicy
from app.domain.schedule import OnceSchedule
from app.services import attempts
from app.services.attempts import _db_clock, _until_due_s

START = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)
# The monotonic clock when the claim returned, and 2 ms later: now, for these tests.
RETURNED = 100.0
NOW_MONO = RETURNED + 0.002


@pytest.fixture(autouse=True)
def _still_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(attempts, "time", types.SimpleNamespace(monotonic=lambda: NOW_MONO))


def _claimed(due_in_s: float, sent_after_s: float | None) -> ClaimedJob:
    due = START + dt.timedelta(seconds=due_in_s)
    return ClaimedJob(
        id=uuid.uuid4(),
        partition=0,
        tenant_id=uuid.uuid4(),
        target_id=uuid.uuid4(),
        payload_json="{}",
        schedule=OnceSchedule(due),
        schedule_anchor_at=due,
        scheduled_for=due,
        occurrence_id=uuid.uuid4(),
        attempt=1,
        policy=RetryPolicy(3, 1.0, 60.0),
        lease_token=uuid.uuid4(),
        lease_owner="replica",
        claimed_at=START,
        occurrence_claimed_at=START,
        url="http://example.test/hook",
        headers={},
        timeout_s=10.0,
        signing_secret="whsec_test",
        due_at=due,
        sent_at=None if sent_after_s is None else START + dt.timedelta(seconds=sent_after_s),
    )


def test_the_wait_counts_from_when_the_claim_sent_the_row_not_from_its_start() -> None:
    # A claim that started 25 ms before the due time and sent the row 12 ms into it, returned
    # 2 ms ago: 11 ms to wait, not the 23 ms counted from the statement's start.
    assert _until_due_s(_claimed(0.025, 0.012), RETURNED) == pytest.approx(0.011)
    # A row without the send time (the reaper's): counted from the statement's start, late.
    assert _until_due_s(_claimed(0.025, None), RETURNED) == pytest.approx(0.023)


def test_the_database_clock_after_a_claim_is_its_send_time_plus_local_time_since() -> None:
    assert _db_clock(_claimed(0.025, 0.012), RETURNED) == START + dt.timedelta(seconds=0.014)
