"""A brute-force reference for cron fire times, written for the tests only.

Deliberately simple and independent of app/domain: every field is a predicate applied
literally to each local wall-clock day, hour, minute and second in turn (no sets, no
skipping ahead), Vixie cron's day rule is applied as written in its man page, and the
documented DST policy is restated from "which UTC instants show this wall time":

- none (a spring-forward gap): one firing when the clock resumes;
- two (a fall-back overlap): the first; also the second when the hour field is every hour;
- one: that instant.
Instants are collected as a set (an instant fires once) and sorted.

Hashed 'H' items are restated from app/domain/cron_hash.py's docstring, not imported: each
H item becomes the explicit list of the values it allows, found by walking its candidate
values (see hashed_values).
"""

from __future__ import annotations

import calendar
import datetime as dt
import hashlib
from collections.abc import Callable, Iterator
from zoneinfo import ZoneInfo

UTC = dt.UTC
MAX_DAYS_BETWEEN_FIRES = 5 * 365 + 2

ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
MONTHS = "JAN FEB MAR APR MAY JUN JUL AUG SEP OCT NOV DEC".split()
WEEKDAYS = "SUN MON TUE WED THU FRI SAT".split()


def _unname(text: str, names: list[str], first: int) -> str:
    text = text.upper()
    for number, name in enumerate(names, start=first):
        text = text.replace(name, str(number))
    return text


def _cron_weekday(day: dt.date) -> int:
    return day.isoweekday() % 7  # Sunday 0


def _range_predicate(item: str, low: int, high: int, weekday: bool) -> Callable[[int], bool]:
    """`*`, `n`, `a-b`, with an optional `/step`; `a-b` with a > b wraps around."""
    base, slash, step_text = item.partition("/")
    step = int(step_text) if slash else 1
    top = 6 if weekday else high  # where `*` and `n/step` end
    if base == "*":
        a, b = low, top
    elif "-" in base:
        a, b = (int(part) for part in base.split("-"))
    else:
        a = int(base)
        b = top if slash else a
    if weekday and a == 7 and b < 7:
        a = 0
    size = top - low + 1

    def matches(value: int) -> bool:
        # Day-of-week 7 is also Sunday.
        for written in [value, 7] if weekday and value == 0 else [value]:
            if a <= b:
                if a <= written <= b and (written - a) % step == 0:
                    return True
            elif written <= top:
                distance = (written - a) % size
                if distance <= (b - a) % size and distance % step == 0:
                    return True
        return False

    return matches


def _field(text: str, low: int, high: int) -> Callable[[int], bool]:
    items = [_range_predicate(item, low, high, weekday=False) for item in text.split(",")]
    # Each value asked once (the walk asks the same ones again and again).
    table = [any(item(value) for item in items) for value in range(high + 1)]
    return table.__getitem__


def _weekdays_of_month(day: dt.date) -> list[int]:
    length = calendar.monthrange(day.year, day.month)[1]
    return [d for d in range(1, length + 1) if dt.date(day.year, day.month, d).isoweekday() <= 5]


def _day_of_month_item(item: str) -> Callable[[dt.date], bool]:
    if item == "L":
        return lambda day: (day + dt.timedelta(days=1)).month != day.month
    if item == "LW":
        return lambda day: day.day == _weekdays_of_month(day)[-1]
    if item.endswith("W"):
        target = int(item[:-1])

        def nearest(day: dt.date) -> bool:
            if target > calendar.monthrange(day.year, day.month)[1]:
                return False
            return day.day == min(_weekdays_of_month(day), key=lambda d: abs(d - target))

        return nearest
    plain = _range_predicate(item, 1, 31, weekday=False)
    return lambda day: plain(day.day)


def _day_of_week_item(item: str) -> Callable[[dt.date], bool]:
    if "#" in item:
        weekday, nth = (int(part) for part in item.split("#"))

        def nth_weekday(day: dt.date) -> bool:
            same = [d for d in range(1, day.day + 1) if _cron_weekday(day.replace(day=d)) == weekday % 7]
            return _cron_weekday(day) == weekday % 7 and len(same) == nth

        return nth_weekday
    if "L" in item:
        weekday = int(item.replace("L", ""))
        return lambda day: _cron_weekday(day) == weekday % 7 and (day + dt.timedelta(days=7)).month != day.month
    plain = _range_predicate(item, 0, 7, weekday=True)
    return lambda day: plain(_cron_weekday(day))


class Reference:
    def __init__(self, expression: str) -> None:
        fields = expression.split()
        if fields[0].startswith("@"):
            fields = ALIASES[fields[0].lower()].split()
        self.has_seconds = len(fields) == 6
        if not self.has_seconds:
            fields = ["0", *fields]
        second, minute, hour, dom, month, dow = fields
        dom = "*" if dom == "?" else dom
        dow = "*" if dow == "?" else dow
        self.second = _field(second, 0, 59)
        self.minute = _field(minute, 0, 59)
        self.hour = _field(hour, 0, 23)
        self.month = _field(_unname(month, MONTHS, 1), 1, 12)
        dom_items = [_day_of_month_item(item) for item in dom.upper().split(",")]
        dow_items = [_day_of_week_item(item) for item in _unname(dow, WEEKDAYS, 0).split(",")]
        self.dom: Callable[[dt.date], bool] = lambda day: any(item(day) for item in dom_items)
        self.dow: Callable[[dt.date], bool] = lambda day: any(item(day) for item in dow_items)
        # Vixie cron: "If either field begins with *, a day must match both; if both are
        # restricted, either may match."
        self.either_is_star = dom.startswith("*") or dow.startswith("*")
        self.every_hour = all(self.hour(h) for h in range(24))

    def day_matches(self, day: dt.date) -> bool:
        if not self.month(day.month):
            return False
        if self.either_is_star:
            return self.dom(day) and self.dow(day)
        return self.dom(day) or self.dow(day)

    def walls_from(self, start: dt.datetime) -> Iterator[dt.datetime]:
        """Matching wall times >= start, each day, hour, minute and second in turn."""
        day = start.date()
        last_match = day
        while (day - last_match).days <= MAX_DAYS_BETWEEN_FIRES:
            if self.day_matches(day):
                for hour in range(24):
                    if not self.hour(hour):
                        continue
                    for minute in range(60):
                        if not self.minute(minute):
                            continue
                        for second in range(60 if self.has_seconds else 1):
                            wall = dt.datetime.combine(day, dt.time(hour, minute, second))
                            if self.second(second) and wall >= start:
                                last_match = day
                                yield wall
            day += dt.timedelta(days=1)

    def upcoming(self, zone: ZoneInfo, after: dt.datetime, count: int) -> list[dt.datetime]:
        """The first `count` fire instants (UTC) strictly after `after`."""
        # Only around a clock change can a wall time's instants come out of wall-time order,
        # by at most the size of the change (two hours at most): walk three hours either
        # side there.
        margin = dt.timedelta(hours=3)
        wall_after = after.astimezone(zone).replace(tzinfo=None, microsecond=0)
        start = wall_after - margin if near_a_clock_change(zone, after) else wall_after
        found: set[dt.datetime] = set()
        enough_at: dt.datetime | None = None
        for wall in self.walls_from(start):
            if enough_at is not None and wall > enough_at:
                break
            instants = self.instants(zone, wall)
            found.update(instant for instant in instants if instant > after)
            if enough_at is None and len(found) >= count:
                enough_at = wall + margin if near_a_clock_change(zone, instants[0]) else wall
        return sorted(found)[:count]

    def instants(self, zone: ZoneInfo, wall: dt.datetime) -> list[dt.datetime]:
        showing = showing_instants(zone, wall)
        if not showing:
            return [clock_resumes(zone, wall)]
        if len(showing) == 2 and not self.every_hour:
            return showing[:1]
        return showing


def showing_instants(zone: ZoneInfo, wall: dt.datetime) -> list[dt.datetime]:
    """Every UTC instant at which the clock in `zone` reads `wall`, in order."""
    candidates = set()
    for fold in (0, 1):
        offset = wall.replace(tzinfo=zone, fold=fold).utcoffset()
        assert offset is not None
        candidates.add((wall - offset).replace(tzinfo=UTC))
    return sorted(c for c in candidates if c.astimezone(zone).replace(tzinfo=None) == wall)


def near_a_clock_change(zone: ZoneInfo, instant: dt.datetime) -> bool:
    # Clock changes are months apart: within four hours either side there is at most one.
    offsets = {(instant + dt.timedelta(hours=hours)).astimezone(zone).utcoffset() for hours in (-4, 4)}
    return len(offsets) > 1


def clock_resumes(zone: ZoneInfo, wall: dt.datetime) -> dt.datetime:
    """For a wall time the clock skips: the first instant (on the minute; tzdata changes
    are) whose clock reading is later than `wall`."""
    offsets = [wall.replace(tzinfo=zone, fold=fold).utcoffset() for fold in (0, 1)]
    # Reading `wall` with the larger offset gives an instant before the change.
    instant = (wall - max(offset for offset in offsets if offset is not None)).replace(tzinfo=UTC, second=0)
    while instant.astimezone(zone).replace(tzinfo=None) <= wall:
        instant += dt.timedelta(minutes=1)
    return instant


# Hashed 'H' items. Per field: the values a plain `H` or `H/n` chooses among, and those an
# explicit `H(a-b)` may name.
H_CANDIDATES = {
    "second": (range(60), range(60)),
    "minute": (range(60), range(60)),
    "hour": (range(24), range(24)),
    "day-of-month": (range(1, 29), range(1, 32)),
    "month": (range(1, 13), range(1, 13)),
    "day-of-week": (range(7), range(8)),
}


def hash_number(seed: str, field: str) -> int:
    """sha256 of the seed, a NUL and the field's name, read as one big-endian number."""
    digest = hashlib.sha256()
    digest.update(seed.encode("utf-8", "surrogatepass"))
    digest.update(b"\0")
    digest.update(field.encode("ascii"))
    return int(digest.hexdigest(), 16)


def hashed_values(item: str, field: str, seed: str) -> list[int]:
    """The values one H item allows: of its candidates in increasing order, the one at
    position h mod their count (no step), or every one whose distance from the first
    candidate is h mod n, modulo n (a step n)."""
    h = hash_number(seed, field)
    body, slash, step_text = item.upper().partition("/")
    everything, nameable = H_CANDIDATES[field]
    if body == "H":
        candidates = list(everything)
    else:
        first, last = body.removeprefix("H(").removesuffix(")").split("-")
        candidates = [value for value in nameable if int(first) <= value <= int(last)]
    if not slash:
        return [candidates[h % len(candidates)]]
    step = int(step_text)
    return [value for value in candidates if (value - candidates[0]) % step == h % step]


def resolve_hash(expression: str, seed: str) -> str:
    """`expression` with each H item written out as the explicit list of its values."""
    fields = expression.split()
    if fields[0].startswith("@"):
        return expression
    names = ["second", "minute", "hour", "day-of-month", "month", "day-of-week"][-len(fields) :]
    written = []
    for name, text in zip(names, fields, strict=True):
        items: list[str] = []
        for item in text.split(","):
            if item.upper().startswith("H"):
                items.extend(str(value) for value in hashed_values(item, name, seed))
            else:
                items.append(item)
        written.append(",".join(items))
    return " ".join(written)
