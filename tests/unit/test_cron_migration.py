"""app.domain.cron_migration: the old evaluation (croniter 7, as before issue 13) against the
new one, from the same instant and with the same DST policy."""

from __future__ import annotations

import datetime as dt

import pytest

from app.domain.cron_migration import compare

UTC = dt.UTC
AFTER = dt.datetime(2026, 11, 23, 10, 30, tzinfo=UTC)  # a Monday


def test_a_one_value_range_was_hourly_and_is_daily() -> None:
    change = compare("0 9-9 * * *", "UTC", AFTER, 5)
    assert change.changed and change.first_difference == 0
    assert change.old_fires == tuple(AFTER.replace(minute=0) + dt.timedelta(hours=h) for h in range(1, 6))
    assert change.new_fires == tuple(dt.datetime(2026, 11, 24 + d, 9, tzinfo=UTC) for d in range(5))


def test_the_day_rule_was_or_and_is_and() -> None:
    change = compare("15 12 */10 * SAT", "Europe/Berlin", AFTER, 3)
    assert change.changed
    # Old: every 10th day or any Saturday (the 28th is a Saturday, the 21st a 10th day).
    assert change.old_fires[0] == dt.datetime(2026, 11, 28, 11, 15, tzinfo=UTC)
    # New: Saturdays that are the 1st, 11th, 21st or 31st (12:15 CET is 11:15Z; CEST 10:15Z).
    assert change.new_fires[0] == dt.datetime(2027, 5, 1, 10, 15, tzinfo=UTC)


def test_once_never_fires_now_fires() -> None:
    change = compare("0 1 28-31 * 3#2", "UTC", AFTER, 3)
    assert change.changed and change.old_accepted
    assert change.old_fires == () and change.old_error is not None and "never fires" in change.old_error
    assert change.new_fires[0] == dt.datetime(2026, 11, 28, 1, tzinfo=UTC)


def test_forms_the_old_code_refused_are_marked() -> None:
    change = compare("0 0 LW * *", "UTC", AFTER, 3)
    assert not change.old_accepted and change.changed
    assert change.new_fires[0] == dt.datetime(2026, 11, 30, tzinfo=UTC)


@pytest.mark.parametrize(
    "expression", ["*/5 * * * *", "0 9 * * 1-5", "30 2 * * *", "0 0 1 * *", "0 12 L * *", "0 9 * * MON#1", "@hourly"]
)
@pytest.mark.parametrize("timezone", ["UTC", "America/New_York", "Australia/Lord_Howe"])
def test_common_expressions_do_not_change(expression: str, timezone: str) -> None:
    # Across New York's fall-back and Lord Howe's spring-forward too.
    for after in (AFTER, dt.datetime(2026, 10, 31, 12, tzinfo=UTC), dt.datetime(2026, 10, 3, 12, tzinfo=UTC)):
        change = compare(expression, timezone, after, 50)
        assert not change.changed, (expression, timezone, after)
        assert change.first_difference is None
        assert len(change.new_fires) == 50
