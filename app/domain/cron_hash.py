"""Hashed cron values ('H', as in Jenkins): resolved per job into ordinary field values.

A thousand jobs written "0 * * * *" all fire at minute 0 and hit their receivers (and our
dispatcher) in the same second. Jenkins' answer is `H`: "some value of this field, picked
by hashing the job", so "H * * * *" spreads those jobs over the hour while each one keeps
its own minute forever. This module owns that resolution; app/domain/cron.py keeps
refusing a raw `H`, and callers resolve first, then parse the resolved text:
`parse_cron(resolve_hashed(expression, seed))`.

Forms
    Any list item of any field (seconds when there are 6 fields, minute, hour,
    day-of-month, month, day-of-week) may be one of the forms below, alone or beside
    ordinary items ("H,30"). `h` is the field's hash number (see Hash); [low, high] is the
    field's H range, [a, b] an explicit one:

    `H`         one value: low + h % (high - low + 1)
    `H(a-b)`    one value: a + h % (b - a + 1)
    `H/n`       every n-th value from an offset: start = low + h % n, then start, start+n,
                ... up to high; written "start-high/n" ("H/15" -> "7-59/15")
    `H(a-b)/n`  the same within [a, b]: start = a + h % n; written "start-b/n"

    A one-value form is written as that number. 2 <= n <= (size of the range) and a <= b
    (H ranges do not wrap around); `H/1` is refused because Jenkins reads it as `H` while
    the rule above reads it as `*`. Ranges: second and minute 0-59, hour 0-23, month
    1-12, day-of-week 0-6, day-of-month 1-28 so that every month fires (Jenkins does the
    same). An explicit H(a-b) may name any value its field accepts (day-of-month up to 31,
    day-of-week up to 7, which is Sunday). `h` is case-insensitive; the weekday name THU is
    not an H.

Hash
    h = int.from_bytes(sha256(UTF-8 of f"{seed}\\x00{field name}"), "big"), the field names
    being exactly "second", "minute", "hour", "day-of-month", "month", "day-of-week".
    So a field's value depends on the seed (the job's id) and the field's name only:
    editing another field, adding a seconds field, restarts, replicas and upgrades never
    move it. The names and the rule are a stored contract: changing either moves every
    hashed job. Python's hash() is salted per process and would differ between replicas;
    the 256-bit number makes the modulo bias negligible (below 2**-249). Every H item of
    one field uses the same h, so `H/15` always includes the minute `H` would pick.

Semantics and DST
    Resolution happens BEFORE anything else: the result is an ordinary expression, and
    cron.py's rules apply to it unchanged, its DST policy (gap and overlap) included; an H
    hour that lands in a spring-forward gap fires when the clock resumes, like any written
    hour. The day rule too: a resolved day-of-month no longer starts with `*`, so
    "0 0 H * H" fires on the hashed day OR the hashed weekday, as "0 0 12 * 3" would.

Anything resolve_hashed cannot read as fields (an alias, an expression longer than
cron.MAX_EXPRESSION_LENGTH, a wrong number of fields) is returned unchanged for parse_cron
to accept or refuse with its own message. A malformed H item raises CronError(field="cron")
naming the field and its value.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Final

from app.domain.cron import MAX_EXPRESSION_LENGTH, CronError


@dataclass(frozen=True)
class _HashRange:
    """Where a field's H values come from."""

    low: int
    # The highest value of a plain `H` or `H/n`.
    high: int
    # The highest value an explicit H(a-b) may name: what the field itself accepts.
    top: int


_RANGES: Final[dict[str, _HashRange]] = {
    "second": _HashRange(0, 59, 59),
    "minute": _HashRange(0, 59, 59),
    "hour": _HashRange(0, 23, 23),
    # Day 28 is the last one every month has: an H day never skips February.
    "day-of-month": _HashRange(1, 28, 31),
    "month": _HashRange(1, 12, 12),
    # 0 and 7 are both Sunday: a plain H over 0-7 would pick Sunday twice as often.
    "day-of-week": _HashRange(0, 6, 7),
}
_FIVE_FIELDS: Final = ("minute", "hour", "day-of-month", "month", "day-of-week")
_SIX_FIELDS: Final = ("second", *_FIVE_FIELDS)

# ASCII digits only, as parse_cron accepts: int() would read other scripts' digits too.
_H_ITEM_RE: Final = re.compile(r"H(?:\(([0-9]{1,4})-([0-9]{1,4})\))?(?:/([0-9]{1,4}))?")
# The same separator rule as parse_cron: ASCII whitespace only.
_FIELD_RE: Final = re.compile(r"\S+", re.ASCII)
_FORMS: Final = "H, H/n, H(a-b) or H(a-b)/n"


def has_hash(expression: str) -> bool:
    """Whether any field of `expression` holds an H item (aliases never do). Cheap."""
    if "H" not in expression and "h" not in expression:
        return False
    fields = _FIELD_RE.findall(expression)
    return bool(fields) and not fields[0].startswith("@") and any(_holds_h(value) for value in fields)


def resolve_hashed(expression: str, seed: str) -> str:
    """`expression` with every H item replaced by ordinary values hashed from (seed, field name).

    Returns `expression` itself when there is nothing to resolve (no H, an alias) or when
    parse_cron will refuse it anyway (too long, a wrong number of fields). Otherwise the
    fields are joined by single spaces, those without H as written. Raises
    CronError(field="cron") for a malformed H item, naming the field and its value. Pure.
    """
    if len(expression) > MAX_EXPRESSION_LENGTH or not has_hash(expression):
        return expression
    fields = _FIELD_RE.findall(expression)
    if len(fields) not in (5, 6):
        return expression
    names = _SIX_FIELDS if len(fields) == 6 else _FIVE_FIELDS
    resolved = " ".join(
        _resolve_field(expression, name, value, seed) for name, value in zip(names, fields, strict=True)
    )
    # "H/15" becomes "14-59/15": a long list of H items can outgrow the limit it was under.
    if len(resolved) > MAX_EXPRESSION_LENGTH:
        raise CronError(
            "cron",
            f"invalid cron expression {expression!r}: with its H values resolved ({resolved!r}) it is "
            f"longer than {MAX_EXPRESSION_LENGTH} characters",
        )
    return resolved


def _field_hash(seed: str, field_name: str) -> int:
    """The hash number h of one field of a job's expression (see the module docstring)."""
    # surrogatepass: a seed from decoded JSON may hold a lone surrogate; it must hash, not raise.
    data = f"{seed}\x00{field_name}".encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.sha256(data).digest(), "big")


def _holds_h(text: str) -> bool:
    # THU (Thursday) is the one field name with an H in it.
    return "H" in text.upper().replace("THU", "")


def _resolve_field(expression: str, name: str, value: str, seed: str) -> str:
    if not _holds_h(value):
        return value
    number = _field_hash(seed, name)
    return ",".join(
        _resolve_item(expression, name, value, item, number) if _holds_h(item) else item for item in value.split(",")
    )


def _resolve_item(expression: str, name: str, value: str, item: str, number: int) -> str:
    field_range = _RANGES[name]

    def refused(reason: str) -> CronError:
        where = f"{item!r}: " if item != value else ""
        return CronError("cron", f"invalid cron expression {expression!r}: {name} field {value!r}: {where}{reason}")

    match = _H_ITEM_RE.fullmatch(item.upper())
    if match is None:
        raise refused(f"H is accepted only as {_FORMS}")
    first, last, step_text = match.groups()
    if first is None:
        low, high = field_range.low, field_range.high
    else:
        low, high = int(first), int(last)
        for bound in (low, high):
            if not field_range.low <= bound <= field_range.top:
                raise refused(f"{bound} is out of range ({field_range.low}-{field_range.top})")
        if low > high:
            raise refused(f"H({low}-{high}) needs its first value no larger than its last (H ranges do not wrap)")
    size = high - low + 1
    if step_text is None:
        return str(low + number % size)
    step = int(step_text)
    if step == 1:
        raise refused("step 1 is ambiguous (Jenkins reads H/1 as H): write H for one value, * for every value")
    if not 2 <= step <= size:
        raise refused(f"step {step} is out of range (2-{size})")
    return f"{low + number % step}-{high}/{step}"
