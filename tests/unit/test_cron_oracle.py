"""app.domain.cron against a brute-force reference (tests/unit/cron_reference.py).

A seeded random set of (expression, zone, start) cases: expressions mix ranges (one-value
ones too), wrap-around ranges, steps, lists, names, `*`-prefixed and restricted day
fields, `?`, `#`, `L`, `LW`, `nW`, seconds fields and aliases; zones have DST in both
hemispheres, with 30- and 45-minute offsets or shifts; half the starts lie just before a
clock change. The engine must give exactly the reference's next fire instants.

A second, smaller set puts Jenkins-style hashed items (H, H/n, H(a-b), H(a-b)/n) into those
expressions, alone or beside ordinary items, with a random seed per case: the engine runs on
app.domain.cron_hash's resolution, the reference on its own (cron_reference.resolve_hash).
"""

from __future__ import annotations

import datetime as dt
import functools
import random
import uuid
from zoneinfo import ZoneInfo

import pytest

from app.domain.cron import CronError, next_fire, parse_cron, upcoming
from app.domain.cron_hash import resolve_hashed
from tests.unit.cron_reference import MONTHS, WEEKDAYS, Reference, resolve_hash

UTC = dt.UTC
SEED = 20261123
CASES = 3000
HASHED_CASES = 400
FIRES = 5

ZONES = [
    "UTC",
    "America/New_York",
    "America/St_Johns",  # -03:30 / -02:30
    "America/Havana",  # changes at midnight: the gap and the overlap cross the day boundary
    "America/Santiago",  # southern hemisphere
    "Europe/Berlin",
    "Europe/Dublin",  # "negative DST" in tzdata
    "Africa/Casablanca",  # an hour back for Ramadan, every year at a different date
    "Asia/Kathmandu",  # +05:45, no DST
    "Australia/Sydney",
    "Australia/Lord_Howe",  # +10:30 / +11: a 30-minute shift
    "Pacific/Chatham",  # +12:45 / +13:45
    "Pacific/Auckland",
    "Antarctica/Troll",  # a two-hour shift
]

FIRST = dt.datetime(2026, 1, 1, tzinfo=UTC)
LAST = dt.datetime(2030, 12, 31, tzinfo=UTC)

ALIASES = ["@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"]


@functools.cache
def clock_changes(timezone: str) -> list[dt.datetime]:
    """The instants (to the hour) at which the zone's offset changes, 2026-2030."""
    zone = ZoneInfo(timezone)
    changes = []
    instant, offset = FIRST, FIRST.astimezone(zone).utcoffset()
    while instant < LAST:
        instant += dt.timedelta(hours=1)
        now_offset = instant.astimezone(zone).utcoffset()
        if now_offset != offset:
            changes.append(instant)
            offset = now_offset
    return changes


def _number_item(rnd: random.Random, low: int, high: int, hot: list[int]) -> str:
    """One list item of a numeric field; `hot` values (DST hours) come up more often."""

    def value() -> int:
        return rnd.choice(hot) if hot and rnd.random() < 0.5 else rnd.randint(low, high)

    kind = rnd.random()
    if kind < 0.35:
        return str(value())
    if kind < 0.45:  # a one-value range
        v = value()
        return f"{v}-{v}"
    if kind < 0.65:
        a, b = sorted((value(), value()))
        return f"{a}-{b}" + (f"/{rnd.randint(1, 4)}" if rnd.random() < 0.3 else "")
    if kind < 0.75:  # wrap-around
        a, b = value(), value()
        return f"{max(a, b)}-{min(a, b)}" + (f"/{rnd.randint(2, 3)}" if rnd.random() < 0.3 else "")
    if kind < 0.85:
        return f"{value()}/{rnd.randint(2, 20)}"
    return f"*/{rnd.randint(2, (high - low) // 2 + 1)}"


def _numeric_field(rnd: random.Random, low: int, high: int, star: float, hot: list[int] | None = None) -> str:
    if rnd.random() < star:
        return "*"
    return ",".join(_number_item(rnd, low, high, hot or []) for _ in range(rnd.choice((1, 1, 1, 2, 3))))


def _day_of_month(rnd: random.Random) -> str:
    kind = rnd.random()
    if kind < 0.4:
        return "*"
    if kind < 0.45:
        return "?"
    if kind < 0.55:
        return f"*/{rnd.randint(2, 15)}"
    items = []
    for _ in range(rnd.choice((1, 1, 2))):
        special = rnd.random()
        if special < 0.12:
            items.append("L")
        elif special < 0.22:
            items.append("LW")
        elif special < 0.35:
            items.append(f"{rnd.randint(1, 31)}W")
        else:
            items.append(_number_item(rnd, 1, 31, [1, 15, 28, 29, 30, 31]))
    return ",".join(items)


def _day_of_week(rnd: random.Random) -> str:
    kind = rnd.random()
    if kind < 0.45:
        return "*"
    if kind < 0.5:
        return "?"
    if kind < 0.55:
        return f"*/{rnd.randint(2, 4)}"
    items = []
    for _ in range(rnd.choice((1, 1, 2))):
        weekday = rnd.randint(0, 7)
        name = WEEKDAYS[weekday % 7] if rnd.random() < 0.3 else str(weekday)
        special = rnd.random()
        if special < 0.15:
            items.append(f"{name}#{rnd.randint(1, 5)}")
        elif special < 0.25:
            items.append(f"{weekday}L" if rnd.random() < 0.7 else f"L{weekday}")
        elif special < 0.4:
            other = rnd.randint(0, 7)
            items.append(f"{name}-{WEEKDAYS[other % 7] if rnd.random() < 0.3 else other}")
        else:
            items.append(_number_item(rnd, 0, 7, []) if rnd.random() < 0.5 else name)
    return ",".join(items)


def _month(rnd: random.Random) -> str:
    if rnd.random() < 0.6:
        return "*"
    if rnd.random() < 0.3:
        a, b = rnd.randint(0, 11), rnd.randint(0, 11)
        return f"{MONTHS[a]}-{MONTHS[b]}".lower() if rnd.random() < 0.5 else f"{MONTHS[a]},{MONTHS[b]}"
    return _numeric_field(rnd, 1, 12, 0, [3, 4, 9, 10, 11])


def random_expression(rnd: random.Random) -> str:
    if rnd.random() < 0.04:
        return rnd.choice(ALIASES)
    # Hours and minutes around clock changes (00:00-03:00 local in most zones).
    hot_hours = [0, 1, 2, 3, 23]
    fields = [
        _numeric_field(rnd, 0, 59, 0.3, [0, 15, 30, 45]),
        _numeric_field(rnd, 0, 23, 0.35, hot_hours),
        _day_of_month(rnd),
        _month(rnd),
        _day_of_week(rnd),
    ]
    if rnd.random() < 0.2:
        fields.insert(0, _numeric_field(rnd, 0, 59, 0.2, [0, 30]))
    return " ".join(fields)


def random_start(rnd: random.Random, timezone: str) -> dt.datetime:
    changes = clock_changes(timezone)
    if changes and rnd.random() < 0.5:
        change = rnd.choice(changes)
        hours_before = rnd.choice((3, 36))  # often right at it, inside a gap or an overlap
        return change + dt.timedelta(seconds=rnd.randint(-hours_before * 3600, 3600))
    return FIRST + dt.timedelta(seconds=rnd.randint(0, int((LAST - FIRST).total_seconds())))


# Per field: the range a plain H covers, what an explicit H(a-b) may name, and values near
# clock changes (most happen between 00:00 and 03:00 local) for H(a-b) to favour.
H_FIELDS: dict[str, tuple[int, int, int, list[int]]] = {
    "second": (0, 59, 59, [0, 30]),
    "minute": (0, 59, 59, [0, 15, 30, 45]),
    "hour": (0, 23, 23, [0, 1, 2, 3, 23]),
    "day-of-month": (1, 28, 31, [1, 28, 29, 30, 31]),
    "month": (1, 12, 12, [3, 4, 9, 10, 11]),
    "day-of-week": (0, 6, 7, [0, 6, 7]),
}


def _hashed_item(rnd: random.Random, name: str) -> str:
    low, high, top, hot = H_FIELDS[name]
    kind = rnd.random()
    if kind < 0.3:
        return "H" if rnd.random() < 0.9 else "h"
    if kind < 0.5:
        return f"H/{rnd.randint(2, high - low + 1)}"
    a, b = sorted(rnd.choice(hot) if rnd.random() < 0.5 else rnd.randint(low, top) for _ in range(2))
    if kind < 0.75 or a == b:
        return f"H({a}-{b})"
    return f"H({a}-{b})/{rnd.randint(2, b - a + 1)}"


def random_hashed_expression(rnd: random.Random) -> str:
    """An expression of random_expression's with H items in some fields (at least one)."""
    fields = random_expression(rnd).split()
    while fields[0].startswith("@"):
        fields = random_expression(rnd).split()
    names = list(H_FIELDS)[-len(fields) :]
    hashed = [rnd.random() for _ in names]
    if min(hashed) >= 0.5:
        hashed[rnd.randrange(len(names))] = 0.0
    for index, (name, chance) in enumerate(zip(names, hashed, strict=True)):
        # `?` must be a whole field: an H goes beside anything else, never beside it.
        if chance < 0.35 or (chance < 0.5 and fields[index] == "?"):
            fields[index] = _hashed_item(rnd, name)
        elif chance < 0.5:
            fields[index] += f",{_hashed_item(rnd, name)}"
    return " ".join(fields)


def hashed_daily_expression(rnd: random.Random) -> str:
    """Every day, at an H hour within 00:00-03:00 (where most clock changes are), so that
    hashed hours land in gaps and overlaps often."""
    a, b = sorted(rnd.randint(0, 3) for _ in range(2))
    hour = f"H({a}-{b})" + (f"/{rnd.randint(2, b - a + 1)}" if b > a and rnd.random() < 0.3 else "")
    minute = _hashed_item(rnd, "minute") if rnd.random() < 0.7 else _numeric_field(rnd, 0, 59, 0.3, [0, 30])
    return f"{minute} {hour} * * *"


def hashed_cases() -> list[tuple[str, str, str, dt.datetime]]:
    """(expression, seed, zone, start); seeds look like job ids, a few are not ASCII."""
    rnd = random.Random(SEED + 1)
    generated: list[tuple[str, str, str, dt.datetime]] = []
    while len(generated) < HASHED_CASES:
        expression = random_hashed_expression(rnd) if rnd.random() < 0.7 else hashed_daily_expression(rnd)
        seed = str(uuid.UUID(int=rnd.getrandbits(128), version=4))
        if rnd.random() < 0.05:
            seed = f"tâche-{seed[:8]}"
        timezone = rnd.choice(ZONES)
        generated.append((expression, seed, timezone, random_start(rnd, timezone)))
    return generated


def cases() -> list[tuple[str, str, dt.datetime]]:
    rnd = random.Random(SEED)
    generated: list[tuple[str, str, dt.datetime]] = []
    while len(generated) < CASES:
        expression = random_expression(rnd)
        timezone = rnd.choice(ZONES)
        generated.append((expression, timezone, random_start(rnd, timezone)))
    return generated


def test_the_generator_covers_every_feature() -> None:
    expressions = " ".join(expression for expression, _, _ in cases())
    for feature in ("#", "LW", "W ", "L ", "?", "/", ",", "-", "@", "MON", "jan"):
        assert feature.lower() in expressions.lower(), feature
    assert any(len(e.split()) == 6 for e, _, _ in cases())
    assert {z for _, z, _ in cases()} == set(ZONES)


def test_engine_matches_the_reference() -> None:
    _assert_engine_matches([(expression, expression, timezone, after) for expression, timezone, after in cases()])


def test_the_hashed_generator_covers_every_form() -> None:
    generated = hashed_cases()
    expressions = " ".join(expression for expression, _, _, _ in generated)
    for form in (" H ", " h ", "H/", "H(", ")/", ",H", "THU"):
        assert form in f" {expressions} ", form
    for position, name in enumerate(H_FIELDS):
        six_fields = [e.split() for e, _, _, _ in generated if len(e.split()) == 6]
        assert any("H" in fields[position].upper().replace("THU", "") for fields in six_fields), name
    assert {z for _, _, z, _ in generated} == set(ZONES)
    assert len({seed for _, seed, _, _ in generated}) == HASHED_CASES


def test_hashed_engine_matches_the_reference() -> None:
    """The engine on cron_hash's resolution; the reference on its own resolution of H."""
    _assert_engine_matches(
        [
            (resolve_hashed(expression, seed), resolve_hash(expression, seed), timezone, after)
            for expression, seed, timezone, after in hashed_cases()
        ]
    )


def _assert_engine_matches(compared: list[tuple[str, str, str, dt.datetime]]) -> None:
    """(engine's expression, reference's expression, zone, start): the same fire instants."""
    differences = []
    rejected = 0
    for expression, reference_expression, timezone, after in compared:
        spec = parse_cron(expression)
        want = Reference(reference_expression).upcoming(ZoneInfo(timezone), after, FIRES)
        try:
            got = upcoming(spec, timezone, after, FIRES)
            first = next_fire(spec, timezone, after)
        except CronError as exc:
            assert "never fires" in exc.message
            got, first = [], None
            rejected += 1
        if got != want or (want and first != want[0]):
            differences.append((expression, reference_expression, timezone, after.isoformat(), got, want))
    assert differences == [], f"{len(differences)} of {len(compared)} differ; first: {differences[:3]}"
    # Most generated expressions fire: the comparison is not all "never fires" on both sides.
    assert rejected < len(compared) // 5


@pytest.mark.parametrize(
    ("expression", "after", "expected_utc"),
    [
        # The examples (UTC).
        ("0 9-9 * * *", "2026-01-01T00:00", ["2026-01-01T09:00", "2026-01-02T09:00"]),
        ("5-5 * * * *", "2026-01-01T00:00", ["2026-01-01T00:05", "2026-01-01T01:05"]),
        # Saturdays that are the 1st, 11th, 21st or 31st: AND, since day-of-month starts with *.
        ("15 12 */10 * SAT", "2026-01-01T00:00", ["2026-01-31T12:15", "2026-02-21T12:15", "2026-03-21T12:15"]),
        # Both restricted: the 8th-14th OR the second Wednesday (2026-01-14 is both).
        ("45 22 8-14 * 3#2", "2026-02-13T00:00", ["2026-02-13T22:45", "2026-02-14T22:45", "2026-03-08T22:45"]),
        ("0 1 28-31 * 3#2", "2026-01-01T00:00", ["2026-01-14T01:00", "2026-01-28T01:00", "2026-01-29T01:00"]),
        # Second Wednesdays that are the 1st, 11th, 21st or 31st.
        ("45 9 */10 * 3#2", "2026-01-01T00:00", ["2026-02-11T09:45", "2026-03-11T09:45", "2026-11-11T09:45"]),
        # Extensions: last weekday of the month, last Friday (both spellings), nearest weekday.
        ("0 0 LW * *", "2026-01-01T00:00", ["2026-01-30T00:00", "2026-02-27T00:00", "2026-03-31T00:00"]),
        ("0 0 * * 5L", "2026-01-01T00:00", ["2026-01-30T00:00", "2026-02-27T00:00", "2026-03-27T00:00"]),
        ("0 0 * * L5", "2026-01-01T00:00", ["2026-01-30T00:00", "2026-02-27T00:00", "2026-03-27T00:00"]),
        # 2026-02-01 is a Sunday: 1W is Monday the 2nd; 2026-08-01 a Saturday: Monday the 3rd.
        ("0 0 1W * *", "2026-01-31T00:00", ["2026-02-02T00:00", "2026-03-02T00:00"]),
        ("0 0 1W 8 *", "2026-01-01T00:00", ["2026-08-03T00:00"]),
        # A month without day 31 has no 31W: only 31-day months fire.
        ("0 0 31W * *", "2026-01-01T00:00", ["2026-01-30T00:00", "2026-03-31T00:00", "2026-05-29T00:00"]),
        # ? is * in a day field.
        ("0 0 ? * MON", "2026-01-01T00:00", ["2026-01-05T00:00", "2026-01-12T00:00"]),
        # Wrap-around ranges.
        ("0 22-1 * * *", "2026-01-01T00:30", ["2026-01-01T01:00", "2026-01-01T22:00", "2026-01-01T23:00"]),
        ("0 22-2/2 * * *", "2026-01-01T00:30", ["2026-01-01T02:00", "2026-01-01T22:00", "2026-01-02T00:00"]),
        ("0 0 * * FRI-MON", "2026-01-05T12:00", ["2026-01-09T00:00", "2026-01-10T00:00", "2026-01-11T00:00"]),
        ("0 0 1 NOV-FEB *", "2026-02-15T00:00", ["2026-11-01T00:00", "2026-12-01T00:00", "2027-01-01T00:00"]),
        # Day-of-week 7 is Sunday, also in ranges.
        ("0 0 * * 5-7", "2026-01-01T00:00", ["2026-01-02T00:00", "2026-01-03T00:00", "2026-01-04T00:00"]),
        ("0 0 * * 7-7", "2026-01-01T00:00", ["2026-01-04T00:00", "2026-01-11T00:00"]),
    ],
)
def test_vixie_semantics_by_example(expression: str, after: str, expected_utc: list[str]) -> None:
    start = dt.datetime.fromisoformat(after).replace(tzinfo=UTC)
    expected = [dt.datetime.fromisoformat(text).replace(tzinfo=UTC) for text in expected_utc]
    assert upcoming(parse_cron(expression), "UTC", start, len(expected)) == expected
    assert Reference(expression).upcoming(ZoneInfo("UTC"), start, len(expected)) == expected


@pytest.mark.parametrize(
    ("expression", "message_part"),
    [
        ("0 0 * * L", "# and L are accepted only as d#k or dL"),
        ("0 0 * * 1-5#2", "# and L are accepted only as d#k or dL"),
        ("0 0 * * 5#L", "# and L are accepted only as d#k or dL"),
        ("0 0 * * 1#6", "out of range (1-5)"),
        ("0 0 * * 8", "out of range (0-7)"),
        ("0 0 L-3 * *", "L and W are accepted only as L, LW or nW"),
        ("0 0 1-5W * *", "L and W are accepted only as L, LW or nW"),
        ("0 0 32W * *", "out of range (1-31)"),
        ("0 0 ?/2 * *", "? stands for * and must be the whole field"),
        ("0 0 1,? * *", "? stands for * and must be the whole field"),
        ("0 0 * FOO *", "unexpected character"),
        ("0 0 * * MON-", "not a value, a range or a step"),
        ("0 0 * 13 *", "out of range (1-12)"),
        ("1-2-3 * * * *", "not a value, a range or a step"),
        ("0 0 1,,2 * *", "not a value, a range or a step"),
    ],
)
def test_refused_forms_name_the_field(expression: str, message_part: str) -> None:
    with pytest.raises(CronError) as err:
        parse_cron(expression)
    assert err.value.field == "cron"
    assert message_part in err.value.message
