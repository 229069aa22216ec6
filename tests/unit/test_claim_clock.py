"""A job claimed ahead waits for its due time on the database's clock, mapped to the local one
with the tightest bound recent claims give (app/domain/db_clock.py): not one claim's answer
time late, and never early."""

from __future__ import annotations

import datetime as dt
import random

import pytest

from app.domain.db_clock import DbClock, db_now, until_s
from app.store.claims import ClaimBatch

START = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)


def _at(seconds: float) -> dt.datetime:
    return START + dt.timedelta(seconds=seconds)


def test_a_wait_counts_from_when_the_claim_read_the_clock_not_from_its_start() -> None:
    # A claim read the clock 12 ms after START and its answer was in hand at local 100.002;
    # 2 ms after that, a job due 25 ms after START is 11 ms away (counted from the claim's
    # start, as a statement's now() would have it, it would be 23).
    clock = DbClock()
    clock.observe(100.002, _at(0.012))
    offset = clock.offset_s()
    assert offset is not None
    # (Epoch seconds as floats: exact to a microsecond.)
    assert until_s(_at(0.025), offset, 100.004) == pytest.approx(0.011, abs=1e-6)
    assert abs(db_now(offset, 100.002) - _at(0.012)) <= dt.timedelta(microseconds=1)


def test_the_tightest_recent_bound_is_kept() -> None:
    clock = DbClock(window_s=1.0)
    clock.observe(100.0, _at(0.000) - dt.timedelta(seconds=0.008))  # an answer 8 ms on its way
    loose = clock.offset_s()
    clock.observe(100.5, _at(0.500) - dt.timedelta(seconds=0.001))  # 1 ms
    tight = clock.offset_s()
    clock.observe(100.9, _at(0.900) - dt.timedelta(seconds=0.020))  # a slow one changes nothing
    assert loose is not None and tight is not None
    assert tight == pytest.approx(loose - 0.007, abs=1e-6)
    assert clock.offset_s() == tight


def test_a_reading_older_than_the_window_no_longer_counts() -> None:
    # The clocks may drift or the database's be stepped: an old bound could end waits early.
    clock = DbClock(window_s=1.0)
    clock.observe(100.0, _at(0.0) - dt.timedelta(seconds=0.001))
    clock.observe(100.6, _at(0.6) - dt.timedelta(seconds=0.009))
    assert clock.offset_s() == pytest.approx(100.0 - _at(0.0).timestamp() + 0.001, abs=1e-6)
    clock.observe(101.5, _at(1.5) - dt.timedelta(seconds=0.005))
    # The 1 ms reading is 1.5 s old, the 9 ms one 0.9 s: the tightest left is 5 ms.
    assert clock.offset_s() == pytest.approx(101.5 - _at(1.5).timestamp() + 0.005, abs=1e-6)


def test_no_reading_no_offset() -> None:
    assert DbClock().offset_s() is None


def test_waits_never_end_before_the_database_reaches_the_due_time() -> None:
    # The true offset is fixed; each claim reads the clock, and its answer arrives 0-30 ms
    # later. Whatever the delays, a wait mapped with the bound ends at the due time or after.
    rng = random.Random(7)
    true_offset = 100.0 - START.timestamp()
    clock = DbClock()
    local = 100.0
    for _ in range(500):
        local += rng.uniform(0.001, 0.05)
        read_at_db = dt.datetime.fromtimestamp(local - true_offset, dt.UTC)
        clock.observe(local + rng.uniform(0.0, 0.03), read_at_db)
        offset = clock.offset_s()
        assert offset is not None
        due = read_at_db + dt.timedelta(seconds=rng.uniform(0.0, 0.1))
        woken = local + max(0.0, until_s(due, offset, local))
        # What the database's clock says at that local time.
        assert woken - true_offset >= due.timestamp() - 1e-6
        assert db_now(offset, woken).timestamp() <= woken - true_offset + 1e-6


def test_a_batch_is_read_at_its_latest_row_or_at_the_claims_start_when_empty() -> None:
    empty = ClaimBatch([], _at(0.0), None, 100.0)
    assert empty.clock_at == _at(0.0)
