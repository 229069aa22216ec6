"""app.domain.cron_hash: Jenkins-style H items, resolved per (seed, field name).

The expected values are computed here from the rule in cron_hash's docstring (sha256 of
seed, NUL, field name; a value or an offset by the modulo), by enumerating each form's
candidate values, never by calling the module's own helpers. tests/unit/test_cron_oracle.py
holds the resolved fire times to a brute-force reference.
"""

from __future__ import annotations

import collections
import datetime as dt
import hashlib
import random
from zoneinfo import ZoneInfo

import pytest

from app.domain.cron import MAX_EXPRESSION_LENGTH, CronError, next_fire, parse_cron
from app.domain.cron_fields import parse_fields
from app.domain.cron_hash import has_hash, resolve_hashed

FIELDS = ("second", "minute", "hour", "day-of-month", "month", "day-of-week")
# The range a plain H and H/n cover.
H_RANGES = {
    "second": (0, 59),
    "minute": (0, 59),
    "hour": (0, 23),
    "day-of-month": (1, 28),
    "month": (1, 12),
    "day-of-week": (0, 6),
}
# Explicit ranges and steps per field; day-of-month and day-of-week may name 31 and 7.
EXPLICIT = {
    "second": ((0, 9), (0, 29), 10),
    "minute": ((10, 19), (0, 29), 10),
    "hour": ((9, 17), (8, 20), 4),
    "day-of-month": ((25, 31), (1, 31), 10),
    "month": ((4, 6), (1, 12), 6),
    "day-of-week": ((1, 7), (1, 7), 3),
}
STEPS = {"second": 10, "minute": 15, "hour": 6, "day-of-month": 7, "month": 3, "day-of-week": 2}
SEEDS = [f"00000000-0000-4000-8000-{number:012d}" for number in range(1000)]


def h_of(seed: str, name: str) -> int:
    return int(hashlib.sha256(seed.encode() + b"\x00" + name.encode()).hexdigest(), 16)


def in_field(name: str, text: str) -> str:
    """A six-field expression with `text` in field `name` and `*` elsewhere."""
    return " ".join(text if field == name else "*" for field in FIELDS)


def allowed(expression: str, name: str) -> set[int]:
    """The values field `name` of a (resolved, six-field) expression allows, as parsed."""
    parsed = parse_fields(tuple(parse_cron(expression).expression.upper().split()))
    by_name = {
        "second": parsed.seconds,
        "minute": parsed.minutes,
        "hour": parsed.hours,
        "day-of-month": parsed.day_rule.days,
        "month": parsed.months,
        "day-of-week": parsed.day_rule.weekdays,
    }
    return set(by_name[name])


def expected(name: str, first: int, last: int, step: int | None, seed: str) -> set[int]:
    candidates = list(range(first, last + 1))
    h = h_of(seed, name)
    if step is None:
        values = {candidates[h % len(candidates)]}
    else:
        values = {value for value in candidates if (value - first) % step == h % step}
    return {value % 7 for value in values} if name == "day-of-week" else values


def forms(name: str) -> list[tuple[str, int, int, int | None]]:
    """(text, first, last, step) of each H form in field `name`."""
    low, high = H_RANGES[name]
    (a, b), (c, d), step = EXPLICIT[name]
    return [
        ("H", low, high, None),
        (f"H/{STEPS[name]}", low, high, STEPS[name]),
        (f"H({a}-{b})", a, b, None),
        (f"H({c}-{d})/{step}", c, d, step),
    ]


@pytest.mark.parametrize("name", FIELDS)
def test_each_form_in_each_field_allows_the_hashed_values(name: str) -> None:
    for text, first, last, step in forms(name):
        seen: set[int] = set()
        for seed in SEEDS:
            values = allowed(resolve_hashed(in_field(name, text), seed), name)
            assert values == expected(name, first, last, step, seed), (text, seed)
            seen |= values
        # Over many seeds every candidate (or offset) turns up: the range is all used.
        assert seen == expected(name, first, last, 1, SEEDS[0]), text


def test_the_resolved_text_is_a_value_or_a_stepped_range() -> None:
    for seed in SEEDS[:50]:
        h = h_of(seed, "minute")
        assert resolve_hashed("H * * * *", seed) == f"{h % 60} * * * *"
        assert resolve_hashed("H/15 * * * *", seed) == f"{h % 15}-59/15 * * * *"
        assert resolve_hashed("H(10-19) * * * *", seed) == f"{10 + h % 10} * * * *"
        assert resolve_hashed("H(10-40)/7 * * * *", seed) == f"{10 + h % 7}-40/7 * * * *"
        day = h_of(seed, "day-of-month")
        assert resolve_hashed("0 0 H/10 * *", seed) == f"0 0 {1 + day % 10}-28/10 * *"


def test_resolution_is_pinned_across_versions() -> None:
    # These move every hashed job's schedule if they change: a failure here is a breaking
    # change of the stored contract, not a test to update.
    assert resolve_hashed("H H H H H", "job-1") == "59 3 11 9 3"
    assert resolve_hashed("H H H H H H", "job-1") == "25 59 3 11 9 3"
    assert resolve_hashed("H/15 H(9-17) H/10 * H(1-5)", "job-1") == "14-59/15 15 3-28/10 * 4"


def test_same_seed_same_result_and_each_field_stands_alone() -> None:
    for seed in SEEDS[:200]:
        minute = resolve_hashed("H * * * *", seed).split()[0]
        assert resolve_hashed("H * * * *", seed) == resolve_hashed("H * * * *", seed)
        # Editing the other fields, adding seconds or H elsewhere never moves the minute.
        assert resolve_hashed("H 5 1-3 JAN MON", seed).split()[0] == minute
        assert resolve_hashed("H H H H H", seed).split()[0] == minute
        assert resolve_hashed("30 H * * * *", seed).split()[1] == minute
        assert resolve_hashed("*/5 H H(1-5) * * *", seed).split()[1] == minute
        # Nor does the position of H in a list.
        assert resolve_hashed("H,59 * * * *", seed).split()[0] == f"{minute},59"
        assert resolve_hashed("59,H * * * *", seed).split()[0] == f"59,{minute}"
        hour = resolve_hashed("H H * * *", seed).split()[1]
        assert resolve_hashed("0 H * * *", seed).split()[1] == hour


def test_different_seeds_spread_over_the_field() -> None:
    minutes = collections.Counter(int(resolve_hashed("H * * * *", seed).split()[0]) for seed in SEEDS)
    assert set(minutes) == set(range(60))
    assert max(minutes.values()) <= 3 * len(SEEDS) / 60, minutes.most_common(3)
    hours = collections.Counter(int(resolve_hashed("H H * * *", seed).split()[1]) for seed in SEEDS)
    assert set(hours) == set(range(24))
    assert max(hours.values()) <= 3 * len(SEEDS) / 24, hours.most_common(3)


def random_hashed_expression(rnd: random.Random) -> str:
    fields = []
    for name in FIELDS[rnd.randint(0, 1) :]:
        items = [rnd.choice(forms(name))[0] for _ in range(rnd.choice((1, 1, 2)))]
        if rnd.random() < 0.3:
            items.append(str(H_RANGES[name][0]))
        if rnd.random() < 0.2:
            items = ["*"]
        fields.append(",".join(items))
    return " ".join(fields)


def test_resolved_expressions_are_accepted_by_parse_cron() -> None:
    rnd = random.Random(7)
    for _ in range(2000):
        expression = random_hashed_expression(rnd)
        seed = str(rnd.getrandbits(64))
        resolved = resolve_hashed(expression, seed)
        assert not has_hash(resolved), (expression, resolved)
        parse_cron(resolved)
        # Resolving again changes nothing, whatever the seed.
        assert resolve_hashed(resolved, "another seed") == resolved


def test_h_is_case_insensitive_and_beside_names() -> None:
    seed = SEEDS[3]
    assert resolve_hashed("h/15 h * * *", seed) == resolve_hashed("H/15 H * * *", seed)
    weekday = h_of(seed, "day-of-week") % 7
    assert resolve_hashed("0 0 * * THU,H", seed) == f"0 0 * * THU,{weekday}"
    assert resolve_hashed("0 0 * JAN,H *", seed) == f"0 0 * JAN,{1 + h_of(seed, 'month') % 12} *"


@pytest.mark.parametrize(
    ("expression", "result"),
    [
        ("H * * * *", True),
        ("h/5 * * * *", True),
        ("0 0 * * THU,H", True),
        ("0 0 H(1-5) * * *", True),
        ("5-H * * * *", True),  # not a valid form, but resolve_hashed must see (and refuse) it
        ("0 0 * * THU", False),
        ("0 0 * * thu-sat", False),
        ("@hourly", False),
        ("0 0 1 * *", False),
        ("", False),
        ("   ", False),
    ],
)
def test_has_hash(expression: str, result: bool) -> None:
    assert has_hash(expression) is result


@pytest.mark.parametrize("expression", ["@hourly", "@daily", "0 0 * * THU", "0  0\t1 * *", "*/5 * * * * *"])
def test_expressions_without_h_come_back_unchanged(expression: str) -> None:
    assert resolve_hashed(expression, "seed") == expression


def test_fields_are_joined_by_single_spaces() -> None:
    assert resolve_hashed("H(7-7)\t*  *\n* *", "seed") == "7 * * * *"


def test_what_parse_cron_refuses_anyway_is_left_to_it() -> None:
    too_long = "H " + ",".join(["1"] * 100) + " * * *"
    assert len(too_long) > MAX_EXPRESSION_LENGTH
    assert resolve_hashed(too_long, "seed") == too_long
    with pytest.raises(CronError, match="longer than"):
        parse_cron(resolve_hashed(too_long, "seed"))
    assert resolve_hashed("H * * *", "seed") == "H * * *"
    with pytest.raises(CronError, match="has 4 fields"):
        parse_cron(resolve_hashed("H * * *", "seed"))


def test_an_expression_that_outgrows_the_limit_once_resolved_is_refused() -> None:
    expression = ",".join(["H/15"] * 30) + " * * * *"
    assert len(expression) <= MAX_EXPRESSION_LENGTH
    with pytest.raises(CronError) as err:
        resolve_hashed(expression, "seed")
    assert err.value.field == "cron"
    assert f"longer than {MAX_EXPRESSION_LENGTH} characters" in err.value.message


def test_any_seed_hashes() -> None:
    for seed in ("", "\ud800", "tâche", "a\x00minute"):
        parse_cron(resolve_hashed("H H * * *", seed))


@pytest.mark.parametrize(
    ("expression", "field", "value", "reason"),
    [
        ("H(5-2) * * * *", "minute", "H(5-2)", "H ranges do not wrap"),
        ("H/0 * * * *", "minute", "H/0", "step 0 is out of range (2-60)"),
        ("H/1 * * * *", "minute", "H/1", "step 1 is ambiguous"),
        ("0 H(0-23)/1 * * *", "hour", "H(0-23)/1", "step 1 is ambiguous"),
        ("H/61 * * * *", "minute", "H/61", "step 61 is out of range (2-60)"),
        ("H(0-70) * * * *", "minute", "H(0-70)", "70 is out of range (0-59)"),
        ("0 H(10-12)/4 * * *", "hour", "H(10-12)/4", "step 4 is out of range (2-3)"),
        ("0 0 H/29 * *", "day-of-month", "H/29", "step 29 is out of range (2-28)"),
        ("0 0 H(0-5) * *", "day-of-month", "H(0-5)", "0 is out of range (1-31)"),
        ("0 0 * H(0-12) *", "month", "H(0-12)", "0 is out of range (1-12)"),
        ("0 0 * * H/8", "day-of-week", "H/8", "step 8 is out of range (2-7)"),
        ("0 0 * * H(1-8)", "day-of-week", "H(1-8)", "8 is out of range (0-7)"),
        ("0 0 HL * *", "day-of-month", "HL", "H is accepted only as H, H/n, H(a-b) or H(a-b)/n"),
        ("0 0 HW * *", "day-of-month", "HW", "H is accepted only as"),
        ("0 0 * * H#2", "day-of-week", "H#2", "H is accepted only as"),
        ("0 0 * * HL", "day-of-week", "HL", "H is accepted only as"),
        ("0 0 * * MON,H(1)", "day-of-week", "MON,H(1)", "'H(1)': H is accepted only as"),
        ("0 0 * * THUH", "day-of-week", "THUH", "H is accepted only as"),
        ("5-H * * * *", "minute", "5-H", "H is accepted only as"),
        ("H-5 * * * *", "minute", "H-5", "H is accepted only as"),
        ("H(1-5 * * * *", "minute", "H(1-5", "H is accepted only as"),
        ("H/15/2 * * * *", "minute", "H/15/2", "H is accepted only as"),
        ("0 0 * JAN-H *", "month", "JAN-H", "H is accepted only as"),
        ("H/0 * * * * *", "second", "H/0", "step 0 is out of range (2-60)"),
        ("H/\u0661\u0665 * * * *", "minute", "H/\u0661\u0665", "H is accepted only as"),
    ],
)
def test_invalid_forms_are_refused_naming_the_field(expression: str, field: str, value: str, reason: str) -> None:
    with pytest.raises(CronError) as err:
        resolve_hashed(expression, "seed")
    assert err.value.field == "cron"
    assert f"{field} field {value!r}" in err.value.message
    assert reason in err.value.message


def test_a_hashed_hour_follows_the_dst_policy_like_a_written_one() -> None:
    # H resolves before the DST policy applies: an H hour of 2 in New York on the day the
    # clocks skip 02:00-03:00 fires once, when the clock resumes at 03:00 EDT.
    seed = next(seed for seed in SEEDS if h_of(seed, "hour") % 24 == 2)
    resolved = resolve_hashed("H(30-30) H * * *", seed)
    assert resolved == "30 2 * * *"
    after = dt.datetime(2026, 3, 8, 0, 0, tzinfo=ZoneInfo("America/New_York"))
    assert next_fire(parse_cron(resolved), "America/New_York", after) == dt.datetime(2026, 3, 8, 7, 0, tzinfo=dt.UTC)
