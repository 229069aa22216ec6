"""Cron fields: which values each field allows, and the naive wall times an expression matches.

Matched here, not by croniter, so that what an expression means cannot change with the
installed croniter version (croniter 7 reads a one-value range such as `9-9` as the whole
field, and combines day-of-month and day-of-week by OR where Vixie cron uses AND).

Vixie cron's rules, with our extensions as ordinary restrictions of their field:
- A field is a comma-separated list of `*`, `n`, `a-b`, each optionally `/step`; `n/step`
  runs from n to the field's maximum. `a-b` with a > b wraps around the field's cycle
  (`22-2` is 22,23,0,1,2; `FRI-MON` is Fri,Sat,Sun,Mon; a step counts on across the wrap:
  `22-2/2` is 22,0,2). Day-of-week 0 and 7 are both Sunday.
- Day-of-month extensions: `L` (last day), `LW` (last weekday, Mon-Fri), `nW` (the weekday
  nearest day n, never leaving the month; a month without day n has none).
  Day-of-week extensions: `d#k` (k-th weekday d of the month, k 1-5), `dL` or `Ld` (last
  weekday d of the month). `?` alone in either day field means `*`.
- A day matches when day-of-month AND day-of-week match if either field starts with `*`
  (or is `?`), and when day-of-month OR day-of-week matches if both are restricted.
"""

from __future__ import annotations

import bisect
import calendar
import datetime as dt
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

# Evaluating an untrusted expression must be bounded: the search gives up when the next
# match would be more than this many years (counted in days) after the previous one.
MAX_YEARS_BETWEEN_FIRES: Final = 5
MAX_DAYS_BETWEEN_FIRES: Final = MAX_YEARS_BETWEEN_FIRES * 365 + 2

# Inclusive bounds of what may be written in each field, and the cycle a wrap-around range
# and a `*` run over (day-of-week accepts 7 for Sunday but cycles over 0-6).
_BOUNDS: Final[dict[str, tuple[int, int]]] = {
    "second": (0, 59),
    "minute": (0, 59),
    "hour": (0, 23),
    "day-of-month": (1, 31),
    "month": (1, 12),
    "day-of-week": (0, 7),
}
_CYCLE_END: Final[dict[str, int]] = {**{name: high for name, (_, high) in _BOUNDS.items()}, "day-of-week": 6}

_MONTH_NAMES: Final = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
_DAY_NAMES: Final = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")
_NAME_NUMBERS: Final[dict[str, dict[str, str]]] = {
    "month": {name: str(number) for number, name in enumerate(_MONTH_NAMES, start=1)},
    "day-of-week": {name: str(number) for number, name in enumerate(_DAY_NAMES)},
}
_NAME_RE: Final = re.compile(r"[A-Z]{3}")

_ITEM_RE: Final = re.compile(r"(?:(\*)|(\d{1,4})(?:-(\d{1,4}))?)(?:/(\d{1,4}))?")
_NEAREST_WEEKDAY_RE: Final = re.compile(r"(\d{1,2})W")
_NTH_WEEKDAY_RE: Final = re.compile(r"(\d{1,2})#(\d{1,2})")
_LAST_WEEKDAY_RE: Final = re.compile(r"(\d{1,2})L|L(\d{1,2})")


class FieldError(ValueError):
    """One field of an expression is invalid; `field_name` names it ("minute", ...)."""

    def __init__(self, field_name: str, value: str, reason: str, item: str | None = None) -> None:
        where = f"{item!r}: " if item is not None and item != value else ""
        super().__init__(f"{field_name} field {value!r}: {where}{reason}")
        self.field_name = field_name


@dataclass(frozen=True)
class DayRule:
    """What the day-of-month and day-of-week fields allow (cron weekdays: 0 is Sunday)."""

    days: frozenset[int]
    last_day: bool
    last_weekday: bool  # LW
    nearest_weekday: frozenset[int]  # nW
    weekdays: frozenset[int]
    nth_weekdays: frozenset[tuple[int, int]]  # (weekday, k) from d#k
    last_weekdays: frozenset[int]  # dL
    # Vixie's rule: AND when either field starts with `*`, OR when both are restricted.
    both_must_match: bool


@dataclass(frozen=True, eq=False)
class CronFields:
    """A parsed expression: sorted allowed values per field, and the day rule."""

    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    months: frozenset[int]
    day_rule: DayRule
    # Which days of a month match depends only on its length and the weekday of its 1st:
    # (calendar weekday of the 1st, length) -> the matching days, at most 28 entries.
    _month_days: dict[tuple[int, int], tuple[int, ...]] = field(default_factory=dict, repr=False)

    @property
    def frequent(self) -> bool:
        """The hour field matches every hour, however spelled ("*/1", "0-23", "0-11,12-23")."""
        return len(self.hours) == 24

    def month_days(self, year: int, month: int) -> tuple[int, ...]:
        """The matching days of one month, increasing."""
        key = calendar.monthrange(year, month)
        days = self._month_days.get(key)
        if days is None:
            days = self._month_days[key] = _matching_days(self.day_rule, *key)
        return days

    def walls(self, start: dt.datetime, *, inclusive: bool) -> Iterator[dt.datetime]:
        """Matching naive wall times from `start` (inclusive) or after it, increasing.

        Ends when the next match would be more than MAX_DAYS_BETWEEN_FIRES days after the
        previous one (or after `start`), or past the year 9999.
        """
        year, month, day = start.year, start.month, start.day
        # The first day is searched from `start`'s time of day; a fractional second is
        # already past that second's match.
        first_time: tuple[int, int, int] | None = (start.hour, start.minute, start.second)
        if not inclusive or start.microsecond:
            first_time = (start.hour, start.minute, start.second + 1)
        month_start = dt.date(year, month, 1).toordinal()
        limit = start.toordinal() + MAX_DAYS_BETWEEN_FIRES
        while month_start <= limit:
            if month in self.months:
                days = self.month_days(year, month)
                for matching_day in days[bisect.bisect_left(days, day) :]:
                    ordinal = month_start + matching_day - 1
                    if ordinal > limit:
                        return
                    if first_time is not None and matching_day == day:
                        times = self._times_from(*first_time)
                    else:
                        times = self._times_from(0, 0, 0)
                    first_time = None
                    for hour, minute, second in times:
                        yield dt.datetime(year, month, matching_day, hour, minute, second)
                        limit = ordinal + MAX_DAYS_BETWEEN_FIRES
            first_time = None
            month_start += calendar.monthrange(year, month)[1]
            day = 1
            month += 1
            if month == 13:
                year, month = year + 1, 1
                if year > dt.MAXYEAR:
                    return

    def _times_from(self, hour0: int, minute0: int, second0: int) -> Iterator[tuple[int, int, int]]:
        """Matching (hour, minute, second) of one day at or after the given time, in order."""
        hours, minutes, seconds = self.hours, self.minutes, self.seconds
        for hour in hours[bisect.bisect_left(hours, hour0) :]:
            if hour != hour0:
                for minute in minutes:
                    for second in seconds:
                        yield hour, minute, second
                continue
            for minute in minutes[bisect.bisect_left(minutes, minute0) :]:
                if minute != minute0:
                    for second in seconds:
                        yield hour, minute, second
                    continue
                for second in seconds[bisect.bisect_left(seconds, second0) :]:
                    yield hour, minute, second


def parse_fields(fields: tuple[str, ...]) -> CronFields:
    """Five or six (leading seconds) upper-cased fields; raises FieldError. Pure."""
    if len(fields) == 5:
        fields = ("0", *fields)
    second, minute, hour, day_of_month, month, day_of_week = fields
    dom_star = day_of_month == "?" or day_of_month.startswith("*")
    dow_star = day_of_week == "?" or day_of_week.startswith("*")
    days, last_day, last_weekday, nearest = _parse_day_of_month(day_of_month)
    weekdays, nth, last_weekdays = _parse_day_of_week(day_of_week)
    return CronFields(
        seconds=tuple(sorted(_parse_plain("second", second))),
        minutes=tuple(sorted(_parse_plain("minute", minute))),
        hours=tuple(sorted(_parse_plain("hour", hour))),
        months=_parse_plain("month", _names_to_numbers("month", month)),
        day_rule=DayRule(
            days=days,
            last_day=last_day,
            last_weekday=last_weekday,
            nearest_weekday=nearest,
            weekdays=weekdays,
            nth_weekdays=nth,
            last_weekdays=last_weekdays,
            both_must_match=dom_star or dow_star,
        ),
    )


def _names_to_numbers(name: str, value: str) -> str:
    numbers = _NAME_NUMBERS[name]

    def number(match: re.Match[str]) -> str:
        word = match.group()
        if word not in numbers:
            raise FieldError(name, value, f"unknown name {word!r}")
        return numbers[word]

    return _NAME_RE.sub(number, value)


def _parse_plain(name: str, value: str) -> frozenset[int]:
    allowed: set[int] = set()
    for item in value.split(","):
        allowed |= _parse_item(name, value, item)
    return frozenset(allowed)


def _parse_item(name: str, value: str, item: str) -> set[int]:
    match = _ITEM_RE.fullmatch(item)
    if match is None:
        raise FieldError(name, value, "not a value, a range or a step", item)
    star, first, last, step_text = match.groups()
    low = _BOUNDS[name][0]
    cycle_end = _CYCLE_END[name]
    step = 1 if step_text is None else int(step_text)
    if step == 0:
        raise FieldError(name, value, "step 0 is not acceptable")
    if star:
        start, end = low, cycle_end
    else:
        start = _in_range(name, value, int(first))
        if last is not None:
            end = _in_range(name, value, int(last))
        else:
            end = cycle_end if step_text is not None else start
    if start <= end:
        # Day-of-week 7 is Sunday, 0 (5-7 is Fri-Sun).
        numbers = range(start, end + 1, step)
        return {number % 7 for number in numbers} if name == "day-of-week" else set(numbers)
    if name == "day-of-week" and start == 7:  # 7-2 is Sun-Tue
        return set(range(0, end + 1, step))
    # A wrap-around range: on through the end of the cycle, then from its start.
    size = cycle_end - low + 1
    span = (end - start) % size
    return {low + (start - low + offset) % size for offset in range(0, span + 1, step)}


def _in_range(name: str, value: str, number: int) -> int:
    low, high = _BOUNDS[name]
    if not low <= number <= high:
        raise FieldError(name, value, f"{number} is out of range ({low}-{high})")
    return number


def _parse_day_of_month(value: str) -> tuple[frozenset[int], bool, bool, frozenset[int]]:
    name = "day-of-month"
    if value == "?":
        value = "*"
    days: set[int] = set()
    last_day = last_weekday = False
    nearest: set[int] = set()
    for item in value.split(","):
        if item == "L":
            last_day = True
        elif item == "LW":
            last_weekday = True
        elif (match := _NEAREST_WEEKDAY_RE.fullmatch(item)) is not None:
            nearest.add(_in_range(name, value, int(match.group(1))))
        elif "?" in item:
            raise FieldError(name, value, "? stands for * and must be the whole field")
        elif "L" in item or "W" in item:
            raise FieldError(name, value, "L and W are accepted only as L, LW or nW (n one day: 15W)", item)
        else:
            days |= _parse_item(name, value, item)
    return frozenset(days), last_day, last_weekday, frozenset(nearest)


def _parse_day_of_week(raw: str) -> tuple[frozenset[int], frozenset[tuple[int, int]], frozenset[int]]:
    name = "day-of-week"
    value = _names_to_numbers(name, "*" if raw == "?" else raw)
    weekdays: set[int] = set()
    nth: set[tuple[int, int]] = set()
    last: set[int] = set()
    for item in value.split(","):
        if (match := _NTH_WEEKDAY_RE.fullmatch(item)) is not None:
            weekday = _in_range(name, raw, int(match.group(1))) % 7
            k = int(match.group(2))
            if not 1 <= k <= 5:
                raise FieldError(name, raw, "the week number after # is out of range (1-5)", item)
            nth.add((weekday, k))
        elif (match := _LAST_WEEKDAY_RE.fullmatch(item)) is not None:
            last.add(_in_range(name, raw, int(match.group(1) or match.group(2))) % 7)
        elif "?" in item:
            raise FieldError(name, raw, "? stands for * and must be the whole field")
        elif "#" in item or "L" in item:
            reason = "# and L are accepted only as d#k or dL (d one weekday: 5#2, 5L; 5L is the last Friday)"
            raise FieldError(name, raw, reason, item)
        else:
            weekdays |= _parse_item(name, raw, item)
    return frozenset(weekdays), frozenset(nth), frozenset(last)


def _matching_days(rule: DayRule, first_calendar_weekday: int, month_length: int) -> tuple[int, ...]:
    # calendar counts Monday as 0; cron counts Sunday as 0.
    first_weekday = (first_calendar_weekday + 1) % 7

    def weekday_of(day: int) -> int:
        return (first_weekday + day - 1) % 7

    def nearest_weekday(day: int) -> int:
        weekday = weekday_of(day)
        if weekday == 6:  # Saturday: the Friday before, unless that is last month
            return day - 1 if day > 1 else day + 2
        if weekday == 0:  # Sunday: the Monday after, unless that is next month
            return day + 1 if day < month_length else day - 2
        return day

    dom_days = {day for day in rule.days if day <= month_length}
    if rule.last_day:
        dom_days.add(month_length)
    if rule.last_weekday:
        dom_days.add(nearest_weekday(month_length))
    dom_days.update(nearest_weekday(day) for day in rule.nearest_weekday if day <= month_length)

    matching = []
    for day in range(1, month_length + 1):
        weekday = weekday_of(day)
        dow_match = (
            weekday in rule.weekdays
            or (weekday, (day - 1) // 7 + 1) in rule.nth_weekdays
            or (weekday in rule.last_weekdays and day + 7 > month_length)
        )
        dom_match = day in dom_days
        if (dom_match and dow_match) if rule.both_must_match else (dom_match or dow_match):
            matching.append(day)
    return tuple(matching)
