"""app.domain.cron: parsing, fire instants and the DST policy, as golden tables.

Every expected instant was worked out by hand from the zone's offsets (noted beside it)
and checked against zoneinfo. Pure: no database, no clock, no sleeping.
"""

from __future__ import annotations

import datetime as dt
import itertools
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter

from app.domain.cron import CronError, CronSpec, next_fire, parse_cron, upcoming

UTC = dt.UTC


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> dt.datetime:
    return dt.datetime(year, month, day, hour, minute, second, tzinfo=UTC)


def fires(expression: str, timezone: str, after: dt.datetime, count: int) -> list[dt.datetime]:
    return upcoming(parse_cron(expression), timezone, after, count)


# (expression, zone, after, the next fire instants in UTC)
SPRING_FORWARD = [
    # New York, 2026-03-08: 02:00 EST (-5) jumps to 03:00 EDT (-4) at 07:00Z.
    # 02:30 does not exist: it fires once, at 03:00 EDT; the day before and after are normal.
    (
        "30 2 * * *",
        "America/New_York",
        utc(2026, 3, 7),
        [utc(2026, 3, 7, 7, 30), utc(2026, 3, 8, 7), utc(2026, 3, 9, 6, 30)],
    ),
    # 01:30 EST, then 02:00 and 02:30 (gap) and 03:00 EDT are one firing at 07:00Z, then 03:30 EDT.
    (
        "*/30 * * * *",
        "America/New_York",
        utc(2026, 3, 8, 6),
        [utc(2026, 3, 8, 6, 30), utc(2026, 3, 8, 7), utc(2026, 3, 8, 7, 30)],
    ),
    # Every wall time of the hour is in the gap: still one firing, at 03:00 EDT.
    ("*/15 2 * * *", "America/New_York", utc(2026, 3, 8), [utc(2026, 3, 8, 7), utc(2026, 3, 9, 6)]),
    # Berlin, 2026-03-29: 02:00 CET (+1) jumps to 03:00 CEST (+2) at 01:00Z.
    ("30 2 * * *", "Europe/Berlin", utc(2026, 3, 28, 12), [utc(2026, 3, 29, 1), utc(2026, 3, 30, 0, 30)]),
    # 01:30 CET, then 03:00 CEST (02:00, 02:30 and 03:00 collapse), then 03:30 CEST.
    (
        "*/30 * * * *",
        "Europe/Berlin",
        utc(2026, 3, 29, 0),
        [utc(2026, 3, 29, 0, 30), utc(2026, 3, 29, 1), utc(2026, 3, 29, 1, 30)],
    ),
    # Lord Howe, 2026-10-04: 02:00 (+10:30) jumps to 02:30 (+11) at 15:30Z the day before.
    # 02:15 is in the 30-minute gap: it fires at 02:30 (+11); the days around it are normal.
    (
        "15 2 * * *",
        "Australia/Lord_Howe",
        utc(2026, 10, 2),
        [utc(2026, 10, 2, 15, 45), utc(2026, 10, 3, 15, 30), utc(2026, 10, 4, 15, 15)],
    ),
    # 01:45 (+10:30), then 02:00, 02:15 (gap) and 02:30 (+11) as one firing, then 02:45 (+11).
    (
        "*/15 * * * *",
        "Australia/Lord_Howe",
        utc(2026, 10, 3, 15),
        [utc(2026, 10, 3, 15, 15), utc(2026, 10, 3, 15, 30), utc(2026, 10, 3, 15, 45)],
    ),
]

FALL_BACK = [
    # New York, 2026-11-01: 02:00 EDT (-4) falls back to 01:00 EST (-5) at 06:00Z.
    # Fixed time: 01:30 fires once, at 01:30 EDT (05:30Z); not at 01:30 EST (06:30Z).
    ("30 1 * * *", "America/New_York", utc(2026, 10, 31, 12), [utc(2026, 11, 1, 5, 30), utc(2026, 11, 2, 6, 30)]),
    # Frequent: both hours. 01:00 EDT, 01:30 EDT, 01:00 EST, 01:30 EST, 02:00 EST.
    (
        "*/30 * * * *",
        "America/New_York",
        utc(2026, 11, 1, 4, 45),
        [
            utc(2026, 11, 1, 5),
            utc(2026, 11, 1, 5, 30),
            utc(2026, 11, 1, 6),
            utc(2026, 11, 1, 6, 30),
            utc(2026, 11, 1, 7),
        ],
    ),
    # Hourly, spelled 0-23: 01:00 EDT, 01:00 EST, 02:00 EST.
    (
        "0 0-23 * * *",
        "America/New_York",
        utc(2026, 11, 1, 4, 30),
        [utc(2026, 11, 1, 5), utc(2026, 11, 1, 6), utc(2026, 11, 1, 7)],
    ),
    # Berlin, 2026-10-25: 03:00 CEST (+2) falls back to 02:00 CET (+1) at 01:00Z.
    # Fixed time: 02:30 CEST (00:30Z) only; the next day 02:30 CET (01:30Z).
    ("30 2 * * *", "Europe/Berlin", utc(2026, 10, 24, 12), [utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)]),
    # Frequent: 02:00 CEST, 02:30 CEST, 02:00 CET, 02:30 CET, 03:00 CET.
    (
        "*/30 * * * *",
        "Europe/Berlin",
        utc(2026, 10, 24, 23, 45),
        [
            utc(2026, 10, 25, 0),
            utc(2026, 10, 25, 0, 30),
            utc(2026, 10, 25, 1),
            utc(2026, 10, 25, 1, 30),
            utc(2026, 10, 25, 2),
        ],
    ),
    # Lord Howe, 2026-04-05: 02:00 (+11) falls back to 01:30 (+10:30) at 15:00Z the day before.
    # Fixed time: 01:45 fires once, at 01:45 (+11) = 14:45Z; not at 01:45 (+10:30) = 15:15Z.
    ("45 1 * * *", "Australia/Lord_Howe", utc(2026, 4, 4), [utc(2026, 4, 4, 14, 45), utc(2026, 4, 5, 15, 15)]),
    # Frequent: 01:15, 01:30, 01:45 (+11), then 01:30, 01:45 again (+10:30), then 02:00 (+10:30).
    (
        "*/15 * * * *",
        "Australia/Lord_Howe",
        utc(2026, 4, 4, 14, 10),
        [
            utc(2026, 4, 4, 14, 15),
            utc(2026, 4, 4, 14, 30),
            utc(2026, 4, 4, 14, 45),
            utc(2026, 4, 4, 15, 0),
            utc(2026, 4, 4, 15, 15),
            utc(2026, 4, 4, 15, 30),
        ],
    ),
]

# `after` inside the repeated hour: which occurrences are still to come.
INSIDE_THE_OVERLAP = [
    # 05:45Z is 01:45 EDT (first pass). Fixed: 01:30 EST does not fire, so the next day.
    ("30 1 * * *", "America/New_York", utc(2026, 11, 1, 5, 45), [utc(2026, 11, 2, 6, 30)]),
    # Frequent: the second pass (01:00 and 01:30 EST) is still to come, although its wall
    # times are earlier than 01:45.
    (
        "*/30 * * * *",
        "America/New_York",
        utc(2026, 11, 1, 5, 45),
        [utc(2026, 11, 1, 6), utc(2026, 11, 1, 6, 30), utc(2026, 11, 1, 7)],
    ),
    # 06:10Z is 01:10 EST (second pass): 01:30 EST, then 02:00 EST.
    ("*/30 * * * *", "America/New_York", utc(2026, 11, 1, 6, 10), [utc(2026, 11, 1, 6, 30), utc(2026, 11, 1, 7)]),
    ("30 1 * * *", "America/New_York", utc(2026, 11, 1, 6, 10), [utc(2026, 11, 2, 6, 30)]),
    # Seconds field: 05:59:50Z is 01:59:50 EDT; the clock then reads 01:00:00 EST.
    (
        "*/20 * * * * *",
        "America/New_York",
        utc(2026, 11, 1, 5, 59, 50),
        [utc(2026, 11, 1, 6, 0, 0), utc(2026, 11, 1, 6, 0, 20), utc(2026, 11, 1, 6, 0, 40)],
    ),
    ("0 30 1 * * *", "America/New_York", utc(2026, 11, 1, 5), [utc(2026, 11, 1, 5, 30), utc(2026, 11, 2, 6, 30)]),
]

NORMAL_DAYS = [
    ("*/15 * * * *", "UTC", utc(2026, 1, 1, 10, 7), [utc(2026, 1, 1, 10, 15), utc(2026, 1, 1, 10, 30)]),
    # 09:00 in New York is 14:00Z in winter (EST, -5) and 13:00Z in summer (EDT, -4).
    ("0 9 * * *", "America/New_York", utc(2026, 1, 15), [utc(2026, 1, 15, 14)]),
    ("0 9 * * *", "America/New_York", utc(2026, 7, 15), [utc(2026, 7, 15, 13)]),
    # Friday 2026-07-17 after 09:00 EDT: the next weekday is Monday the 20th.
    ("0 9 * * 1-5", "America/New_York", utc(2026, 7, 17, 14), [utc(2026, 7, 20, 13)]),
    # Half- and quarter-hour zones: Kolkata +05:30, Kathmandu +05:45.
    ("30 8 * * *", "Asia/Kolkata", utc(2026, 1, 10), [utc(2026, 1, 10, 3)]),
    ("0 12 * * *", "Asia/Kathmandu", utc(2026, 5, 1), [utc(2026, 5, 1, 6, 15)]),
    # Sydney in January is on daylight time (+11): 1 Feb 00:00 local is 31 Jan 13:00Z.
    ("0 0 1 * *", "Australia/Sydney", utc(2026, 1, 15), [utc(2026, 1, 31, 13), utc(2026, 2, 28, 13)]),
    ("*/5 * * * *", "America/Sao_Paulo", utc(2026, 2, 1, 12, 2), [utc(2026, 2, 1, 12, 5)]),
    # Berlin across its spring change: 08:00 local is 07:00Z (CET), then 06:00Z (CEST).
    ("0 8 * * *", "Europe/Berlin", utc(2026, 3, 28, 0), [utc(2026, 3, 28, 7), utc(2026, 3, 29, 6)]),
    # Leap day: the next one is four years away, within the five-year bound.
    ("0 0 29 2 *", "UTC", utc(2026, 3, 1), [utc(2028, 2, 29), utc(2032, 2, 29)]),
    # Last day of the month, and the first Monday of the month.
    ("0 12 L * *", "UTC", utc(2026, 2, 10), [utc(2026, 2, 28, 12), utc(2026, 3, 31, 12)]),
    ("0 9 * * MON#1", "UTC", utc(2026, 6, 1, 10), [utc(2026, 7, 6, 9)]),
]

SECONDS_FIELD = [
    # Six fields: the FIRST one is seconds.
    (
        "*/20 * * * * *",
        "UTC",
        utc(2026, 1, 1, 12, 0, 5),
        [utc(2026, 1, 1, 12, 0, 20), utc(2026, 1, 1, 12, 0, 40), utc(2026, 1, 1, 12, 1)],
    ),
    ("*/10 * * * * *", "UTC", utc(2026, 1, 1, 12, 0, 50), [utc(2026, 1, 1, 12, 1, 0), utc(2026, 1, 1, 12, 1, 10)]),
    # 09:00:30 CET is 08:00:30Z.
    ("30 0 9 * * *", "Europe/Berlin", utc(2026, 1, 10), [utc(2026, 1, 10, 8, 0, 30)]),
    # 02:30:15 is in New York's spring gap: 03:00:00 EDT.
    ("15 30 2 * * *", "America/New_York", utc(2026, 3, 8), [utc(2026, 3, 8, 7), utc(2026, 3, 9, 6, 30, 15)]),
]

# Wednesday 2026-05-13 10:17Z.
ALIASES = [
    ("@yearly", "UTC", utc(2026, 5, 13, 10, 17), [utc(2027, 1, 1)]),
    ("@annually", "UTC", utc(2026, 5, 13, 10, 17), [utc(2027, 1, 1)]),
    ("@monthly", "UTC", utc(2026, 5, 13, 10, 17), [utc(2026, 6, 1)]),
    ("@weekly", "UTC", utc(2026, 5, 13, 10, 17), [utc(2026, 5, 17)]),
    ("@daily", "UTC", utc(2026, 5, 13, 10, 17), [utc(2026, 5, 14)]),
    ("@midnight", "UTC", utc(2026, 5, 13, 10, 17), [utc(2026, 5, 14)]),
    ("@hourly", "UTC", utc(2026, 5, 13, 10, 17), [utc(2026, 5, 13, 11)]),
    # Midnight in Tokyo (+9) is 15:00Z the day before.
    ("@daily", "Asia/Tokyo", utc(2026, 5, 13, 10, 17), [utc(2026, 5, 13, 15)]),
    # @hourly is a frequent schedule: both 01:00s on New York's fall-back day.
    (
        "@hourly",
        "America/New_York",
        utc(2026, 11, 1, 4, 30),
        [utc(2026, 11, 1, 5), utc(2026, 11, 1, 6), utc(2026, 11, 1, 7)],
    ),
]


@pytest.mark.parametrize(
    ("expression", "timezone", "after", "expected"),
    SPRING_FORWARD + FALL_BACK + INSIDE_THE_OVERLAP + NORMAL_DAYS + SECONDS_FIELD + ALIASES,
)
def test_fire_instants_golden(expression: str, timezone: str, after: dt.datetime, expected: list[dt.datetime]) -> None:
    spec = parse_cron(expression)
    got = upcoming(spec, timezone, after, len(expected))
    assert got == expected
    assert all(instant.utcoffset() == dt.timedelta(0) for instant in got)
    assert next_fire(spec, timezone, after) == expected[0]


@pytest.mark.parametrize(
    ("expression", "normalised", "has_seconds", "frequent"),
    [
        ("*/5 * * * *", "*/5 * * * *", False, True),
        ("  0   9\t* * 1-5 ", "0 9 * * 1-5", False, False),
        ("*/10 * * * * *", "*/10 * * * * *", True, True),
        ("30 0 9 * * *", "30 0 9 * * *", True, False),
        # The hour field decides "frequent": every hour of the day, however spelled.
        ("30 */1 * * *", "30 */1 * * *", False, True),
        ("30 0-23 * * *", "30 0-23 * * *", False, True),
        ("30 0-11,12-23 * * *", "30 0-11,12-23 * * *", False, True),
        ("30 0-22 * * *", "30 0-22 * * *", False, False),
        ("30 */2 * * *", "30 */2 * * *", False, False),
        ("30 9-17 * * *", "30 9-17 * * *", False, False),
        ("0 0 * JAN-MAR mon-fri", "0 0 * JAN-MAR mon-fri", False, False),
        ("@yearly", "0 0 1 1 *", False, False),
        ("@annually", "0 0 1 1 *", False, False),
        ("@monthly", "0 0 1 * *", False, False),
        ("@weekly", "0 0 * * 0", False, False),
        ("@daily", "0 0 * * *", False, False),
        ("@MIDNIGHT", "0 0 * * *", False, False),
        (" @hourly ", "0 * * * *", False, True),
    ],
)
def test_parse_cron_normalises(expression: str, normalised: str, has_seconds: bool, frequent: bool) -> None:
    assert parse_cron(expression) == CronSpec(expression=normalised, has_seconds=has_seconds, frequent=frequent)


@pytest.mark.parametrize(
    ("expression", "message_part"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("* * * *", "4 fields"),
        ("0 0 * * * * *", "7 fields"),
        ("0 0 1 1 * 2030", "out of range"),
        ("61 * * * *", "out of range"),
        ("* 24 * * *", "out of range"),
        ("*/0 * * * *", "not acceptable"),
        ("a b c d e", "unexpected character"),
        ("1\u00a02 * * * *", "unexpected character"),
        ("@reboot", "unsupported cron alias"),
        ("@every 5m", "unsupported cron alias"),
        ("@daily 0", "unsupported cron alias"),
        ("H * * * *", "hashed 'H'"),
        ("H(0-29) * * * *", "hashed 'H'"),
        ("R * * * *", "random 'R'"),
        ("0 0 * * " + "1," * 100 + "2", "longer than 200"),
    ],
)
def test_parse_cron_rejects(expression: str, message_part: str) -> None:
    with pytest.raises(CronError) as err:
        parse_cron(expression)
    assert err.value.field == "cron"
    assert message_part in err.value.message
    assert isinstance(err.value, ValueError)


@pytest.mark.parametrize(
    ("expression", "after"),
    [
        ("0 0 30 2 *", utc(2026, 1, 1)),
        ("0 0 31 4 *", utc(2026, 1, 1)),
        ("0 0 31 2,4,6,9,11 *", utc(2026, 1, 1)),
        ("* * 30 2 *", utc(2026, 1, 1)),
        ("*/10 * * 30 2 *", utc(2026, 1, 1)),
        # 2100 is not a leap year: after 2096 the next Feb 29 is in 2104, beyond the bound.
        ("0 0 29 2 *", utc(2097, 3, 1)),
    ],
)
def test_expression_that_never_fires_is_rejected(expression: str, after: dt.datetime) -> None:
    spec = parse_cron(expression)
    for evaluate in (lambda: next_fire(spec, "UTC", after), lambda: upcoming(spec, "Europe/Berlin", after, 10)):
        with pytest.raises(CronError) as err:
            evaluate()
        assert err.value.field == "cron"
        assert "never fires" in err.value.message


def test_upcoming_stops_when_the_expression_stops_firing() -> None:
    assert fires("0 0 29 2 *", "UTC", utc(2090, 1, 1), 10) == [utc(2092, 2, 29), utc(2096, 2, 29)]


@pytest.mark.parametrize(
    "timezone", ["Mars/Olympus_Mons", "America", "", "../etc/passwd", "/etc/localtime", "localtime"]
)
def test_unknown_timezone_is_rejected(timezone: str) -> None:
    with pytest.raises(CronError) as err:
        next_fire(parse_cron("* * * * *"), timezone, utc(2026, 1, 1))
    assert err.value.field == "timezone"


def test_naive_after_and_bad_count_are_programming_errors() -> None:
    spec = parse_cron("* * * * *")
    with pytest.raises(ValueError, match="naive"):
        next_fire(spec, "UTC", dt.datetime(2026, 1, 1))
    for count in (0, 1001):
        with pytest.raises(ValueError, match="count"):
            upcoming(spec, "UTC", utc(2026, 1, 1), count)


@pytest.mark.parametrize(
    ("expression", "timezone", "after", "expected"),
    [
        ("0 9 * * *", "UTC", utc(2026, 1, 1, 9), utc(2026, 1, 2, 9)),
        # 09:00 JST is exactly 00:00Z.
        ("0 9 * * *", "Asia/Tokyo", utc(2026, 6, 1), utc(2026, 6, 2)),
        ("*/20 * * * * *", "UTC", utc(2026, 1, 1, 0, 0, 20), utc(2026, 1, 1, 0, 0, 40)),
        # The gap's one firing, once it has happened, is not repeated by 03:00 EDT.
        ("*/30 * * * *", "America/New_York", utc(2026, 3, 8, 7), utc(2026, 3, 8, 7, 30)),
        ("30 2 * * *", "America/New_York", utc(2026, 3, 8, 7), utc(2026, 3, 9, 6, 30)),
        # A microsecond before still gets it.
        (
            "30 2 * * *",
            "America/New_York",
            utc(2026, 3, 8, 6, 59, 59) + dt.timedelta(microseconds=999999),
            utc(2026, 3, 8, 7),
        ),
    ],
)
def test_fire_time_equal_to_after_is_not_returned(
    expression: str, timezone: str, after: dt.datetime, expected: dt.datetime
) -> None:
    assert next_fire(parse_cron(expression), timezone, after) == expected


@pytest.mark.parametrize(
    ("expression", "timezone"),
    [("*/30 * * * *", "America/New_York"), ("30 1 * * *", "America/New_York"), ("*/15 * * * *", "Australia/Lord_Howe")],
)
@pytest.mark.parametrize(
    "after_utc", [utc(2026, 11, 1, 5, 45), utc(2026, 11, 1, 6, 10), utc(2026, 4, 4, 14, 50), utc(2026, 4, 4, 15, 5)]
)
def test_offset_of_after_does_not_matter(expression: str, timezone: str, after_utc: dt.datetime) -> None:
    spec = parse_cron(expression)
    expected = upcoming(spec, timezone, after_utc, 5)
    for offset_hours in (-4, -5, 9, 14):
        after = after_utc.astimezone(dt.timezone(dt.timedelta(hours=offset_hours)))
        assert upcoming(spec, timezone, after, 5) == expected
    # The same instant as a zoneinfo datetime, second pass of the overlap included (fold=1).
    assert upcoming(spec, timezone, after_utc.astimezone(ZoneInfo(timezone)), 5) == expected


def test_after_in_the_second_pass_given_as_local_time() -> None:
    # 01:10 EST (fold=1) is 06:10Z; 01:10 EDT (fold=0) is 05:10Z.
    new_york = ZoneInfo("America/New_York")
    second_pass = dt.datetime(2026, 11, 1, 1, 10, fold=1, tzinfo=new_york)
    first_pass = dt.datetime(2026, 11, 1, 1, 10, fold=0, tzinfo=new_york)
    spec = parse_cron("*/30 * * * *")
    assert next_fire(spec, "America/New_York", second_pass) == utc(2026, 11, 1, 6, 30)
    assert next_fire(spec, "America/New_York", first_pass) == utc(2026, 11, 1, 5, 30)


@pytest.mark.parametrize(
    ("expression", "timezone", "after"),
    [
        ("*/30 * * * *", "America/New_York", utc(2026, 10, 31, 12)),
        ("*/30 * * * *", "America/New_York", utc(2026, 3, 7, 12)),
        ("*/15 * * * *", "Australia/Lord_Howe", utc(2026, 4, 4)),
        ("*/15 * * * *", "Australia/Lord_Howe", utc(2026, 10, 3)),
        ("*/7 * * * * *", "Europe/Berlin", utc(2026, 10, 25, 0, 55)),
        ("30 1 * * *", "America/New_York", utc(2026, 10, 1)),
    ],
)
def test_upcoming_is_strictly_increasing_across_a_dst_change(
    expression: str, timezone: str, after: dt.datetime
) -> None:
    got = upcoming(parse_cron(expression), timezone, after, 1000)
    assert len(got) == 1000
    assert got[0] > after
    assert all(earlier < later for earlier, later in itertools.pairwise(got))
    # upcoming is next_fire applied repeatedly.
    chained = [next_fire(parse_cron(expression), timezone, after)]
    for _ in range(99):
        chained.append(next_fire(parse_cron(expression), timezone, chained[-1]))
    assert chained == got[:100]


def _policy_by_brute_force(spec: CronSpec, zone: ZoneInfo, start: dt.datetime, end: dt.datetime) -> list[dt.datetime]:
    """The DST policy restated instant by instant (each UTC minute in [start, end)): an
    independent check of how app.domain.cron maps wall times to instants."""
    minute = dt.timedelta(minutes=1)
    # Which wall times match is croniter's business, not the policy's: list them once.
    first_wall = start.astimezone(zone).replace(tzinfo=None) - dt.timedelta(days=1)
    walls = croniter(spec.expression, first_wall, ret_type=dt.datetime)
    matching: set[dt.datetime] = set()
    while (wall := walls.get_next(dt.datetime)) < first_wall + dt.timedelta(days=5):
        matching.add(wall)

    found: set[dt.datetime] = set()
    instant = start
    while instant < end:
        local = instant.astimezone(zone)
        wall = local.replace(tzinfo=None)
        # The clock jumped forward: one firing at this instant if any skipped wall time matches.
        skipped = (instant - minute).astimezone(zone).replace(tzinfo=None) + minute
        while skipped < wall:
            if skipped in matching:
                found.add(instant)
            skipped += minute
        if wall in matching:
            ambiguous = wall.replace(tzinfo=zone, fold=0).utcoffset() != wall.replace(tzinfo=zone, fold=1).utcoffset()
            if spec.frequent or not (ambiguous and local.fold == 1):
                found.add(instant)
        instant += minute
    return sorted(found)


@pytest.mark.parametrize(
    ("expression", "timezone", "day"),
    [
        ("*/30 * * * *", "America/New_York", utc(2026, 11, 1)),
        ("30 1 * * *", "America/New_York", utc(2026, 11, 1)),
        ("*/20 1,2 * * *", "America/New_York", utc(2026, 3, 8)),
        ("*/15 * * * *", "Australia/Lord_Howe", utc(2026, 4, 4)),
        ("10,40 1 * * *", "Australia/Lord_Howe", utc(2026, 4, 4)),
        ("*/15 2 * * *", "Australia/Lord_Howe", utc(2026, 10, 3)),
        # Dublin keeps "negative DST" in tzdata: winter time is the DST-flagged one.
        ("*/20 * * * *", "Europe/Dublin", utc(2026, 10, 24, 12)),
        ("30 1 * * *", "Europe/Dublin", utc(2026, 10, 24, 12)),
        # Troll (Antarctica) moves its clocks by two hours.
        ("*/20 * * * *", "Antarctica/Troll", utc(2026, 10, 24, 12)),
        ("30 2 * * *", "Antarctica/Troll", utc(2026, 3, 28, 12)),
    ],
)
def test_matches_the_policy_applied_minute_by_minute(expression: str, timezone: str, day: dt.datetime) -> None:
    spec = parse_cron(expression)
    zone = ZoneInfo(timezone)
    window_end = day + dt.timedelta(hours=42)
    expected = _policy_by_brute_force(spec, zone, day - dt.timedelta(hours=6), window_end)
    after = day
    while after < day + dt.timedelta(hours=30):
        want = [instant for instant in expected if instant > after][:3]
        got = upcoming(spec, timezone, after, 3)
        assert [instant for instant in got if instant < window_end] == want, after
        after += dt.timedelta(minutes=5, seconds=30)
