"""Cron expressions: validation of untrusted input, and their fire instants in an IANA zone.

Pure functions: no clock reads (`after` is always passed in) and no I/O beyond loading
time-zone data. app/domain/cron_fields.py matches the fields and enumerates naive wall-clock
times; mapping them to instants, and what to do around DST changes, is this module's policy:

Syntax
    Five fields (minute hour day-of-month month day-of-week), or six with a LEADING
    seconds field ("*/10 * * * * *" fires every 10 seconds). The aliases @yearly,
    @annually, @monthly, @weekly, @daily, @midnight and @hourly stand for their
    five-field expressions. Fields mean what Vixie cron means (a one-value range `9-9` is
    that value; day-of-month and day-of-week combine by AND when either starts with `*`,
    by OR when both are restricted); month and weekday names, wrap-around ranges (`22-2`),
    `?` (alone, for `*` in a day field), and the extensions L, LW, nW (day-of-month) and
    d#k, dL (day-of-week) are accepted as restrictions of their field: see cron_fields.py.
    Hashed 'H' values are resolved to plain ones before an expression gets here
    (app/domain/cron_hash.py). Anything else (@reboot, a year field, `L-3`, `1-5#2`, an
    unresolved 'H', random 'R' values) is rejected with CronError(field="cron").

Evaluation is bounded
    An expression with no fire time within MAX_YEARS_BETWEEN_FIRES years after `after`
    (Feb 30 never comes) raises CronError(field="cron", "... never fires ...") after a
    search of about a millisecond, so untrusted expressions cannot make us loop.

DST policy
    * Matching is done on local wall-clock time in the job's zone.
    * Spring-forward gap: a wall time that does not exist (falls in the gap) fires ONCE,
      at the first instant after the gap, i.e. when the local clock resumes (a 02:30
      schedule in America/New_York fires at 03:00 EDT on 2026-03-08). Several gap wall
      times (02:00 and 02:30 for */30) collapse into that one firing, and when the wall
      time right after the gap also matches it is the same firing: an instant fires once.
    * Fall-back overlap: an ambiguous wall time fires once, at its FIRST occurrence
      (fold=0, the earlier instant), for a fixed-time schedule, whose hour field does not
      match every hour ("30 1 * * *"). A frequent schedule, whose hour field matches every
      hour ("*/30 * * * *", "0 0-23 * * *"), fires at BOTH occurrences (fold=0 and
      fold=1), i.e. in both passes of the repeated hour.
    * Shifts that are not whole hours follow the same rules (Australia/Lord_Howe moves its
      clocks by 30 minutes).
"""

from __future__ import annotations

import datetime as dt
import functools
import math
import re
import zoneinfo
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final, Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from app.domain.cron_fields import MAX_YEARS_BETWEEN_FIRES as MAX_YEARS_BETWEEN_FIRES
from app.domain.cron_fields import CronFields, FieldError, parse_fields

UTC = dt.UTC

MAX_EXPRESSION_LENGTH: Final = 200
MAX_UPCOMING: Final = 1000

ALIASES: Final[dict[str, str]] = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

_FIVE_FIELDS: Final = ("minute", "hour", "day-of-month", "month", "day-of-week")
_SIX_FIELDS: Final = ("second", *_FIVE_FIELDS)

# Characters each field may hold once month and weekday names are removed. 'H' and 'R',
# which croniter accepts, are refused here on purpose: 'H' is resolved from its job first
# (app/domain/cron_hash.py), and 'R' picks a different random value every time the
# expression is parsed.
_NUMERIC: Final = frozenset("0123456789*,-/")
_ALLOWED_CHARS: Final[dict[str, frozenset[str]]] = {
    "second": _NUMERIC,
    "minute": _NUMERIC,
    "hour": _NUMERIC,
    "day-of-month": _NUMERIC | frozenset("?LW"),
    "month": _NUMERIC,
    "day-of-week": _NUMERIC | frozenset("?L#"),
}
_NAMES: Final[dict[str, re.Pattern[str]]] = {
    "month": re.compile(r"JAN|FEB|MAR|APR|MAY|JUN|JUL|AUG|SEP|OCT|NOV|DEC"),
    "day-of-week": re.compile(r"SUN|MON|TUE|WED|THU|FRI|SAT"),
}
# Fields are separated by ASCII whitespace only (as croniter did): a no-break space is an
# unexpected character, never a separator.
_FIELD_RE: Final = re.compile(r"\S+", re.ASCII)


class CronError(ValueError):
    """An invalid cron schedule; `field` is "cron" or "timezone"."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


@dataclass(frozen=True)
class CronSpec:
    """A validated cron expression. Build it with parse_cron, which fills every field."""

    # Normalised: aliases expanded, fields separated by single spaces.
    expression: str
    # Six fields, the first of which is seconds.
    has_seconds: bool
    # The hour field matches every hour of the day; decides the fall-back rule.
    frequent: bool


# Every fire-time computation parses its job's expression; the result is immutable, so a
# bounded cache saves re-parsing on the scheduler's hot path (invalid ones raise, uncached).
@functools.lru_cache(maxsize=4096)
def parse_cron(expression: str) -> CronSpec:
    """Validates and normalises an untrusted cron expression; raises CronError(field="cron")."""
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise CronError("cron", f"cron expression is longer than {MAX_EXPRESSION_LENGTH} characters")
    fields = _FIELD_RE.findall(expression)
    if not fields:
        raise CronError("cron", "cron expression is empty")
    if fields[0].startswith("@"):
        alias = fields[0].lower()
        if len(fields) != 1 or alias not in ALIASES:
            raise CronError("cron", f"unsupported cron alias {expression.strip()!r}; use one of {', '.join(ALIASES)}")
        fields = ALIASES[alias].split()
    if len(fields) not in (5, 6):
        raise CronError(
            "cron",
            f"cron expression {expression!r} has {len(fields)} fields; expected 5 (minute hour "
            "day-of-month month day-of-week), or 6 with a leading seconds field",
        )
    has_seconds = len(fields) == 6
    for name, value in zip(_SIX_FIELDS if has_seconds else _FIVE_FIELDS, fields, strict=True):
        _check_field_chars(expression, name, value)

    normalised = " ".join(fields)
    try:
        parsed = _fields_of(normalised)
    except FieldError as exc:
        raise CronError("cron", f"invalid cron expression {expression!r}: {exc}") from exc
    return CronSpec(expression=normalised, has_seconds=has_seconds, frequent=parsed.frequent)


# Parsed fields are immutable (but for their bounded month table): cached, as parse_cron.
@functools.lru_cache(maxsize=4096)
def _fields_of(normalised: str) -> CronFields:
    return parse_fields(tuple(normalised.upper().split(" ")))


def next_fire(spec: CronSpec, timezone: str, after: dt.datetime) -> dt.datetime:
    """The first fire instant strictly after `after` (aware, any offset), as an aware UTC datetime."""
    return upcoming(spec, timezone, after, 1)[0]


def upcoming(spec: CronSpec, timezone: str, after: dt.datetime, count: int) -> list[dt.datetime]:
    """The next `count` fire instants strictly after `after`, strictly increasing, in UTC.

    Fewer than `count` only when the expression stops firing: no fire time within
    MAX_YEARS_BETWEEN_FIRES years after the last one returned.
    """
    if not 1 <= count <= MAX_UPCOMING:
        raise ValueError(f"count must be between 1 and {MAX_UPCOMING}, got {count}")
    if after.tzinfo is None or after.utcoffset() is None:
        raise ValueError("naive datetime; pass an aware datetime")
    fires = fire_times(_fields_of(spec.expression), load_zone(timezone), after, count)
    if not fires:
        raise CronError(
            "cron",
            f"cron expression {spec.expression!r} never fires (no fire time within {MAX_YEARS_BETWEEN_FIRES} years)",
        )
    return fires


class WallMatcher(Protocol):
    """Which naive wall times an expression matches (CronFields; the legacy evaluator of
    app/domain/cron_migration.py)."""

    @property
    def frequent(self) -> bool:
        """The hour field matches every hour of the day; decides the fall-back rule."""
        ...

    def walls(self, start: dt.datetime, *, inclusive: bool) -> Iterator[dt.datetime]:
        """Matching wall times from (or after) `start`, increasing, until the year bound."""
        ...


def fire_times(matcher: WallMatcher, zone: ZoneInfo, after: dt.datetime, count: int) -> list[dt.datetime]:
    """Up to `count` fire instants strictly after `after` (aware), by the DST policy above."""
    fires: list[dt.datetime] = []
    try:
        for instant in _fire_instants(matcher, zone, after.astimezone(UTC)):
            fires.append(instant)
            if len(fires) == count:
                break
    except OverflowError:
        # datetime ends with year 9999: what was found before that is all there is.
        pass
    return fires


@functools.cache
def _zone_names() -> frozenset[str]:
    # The canonical names only: not the "right/" (leap-second) and "posix/" copies of the
    # database, "posixrules", or "Factory" (a placeholder zone, offset 0, named "-00").
    return frozenset(zoneinfo.available_timezones()) - {"Factory", "localtime"}


def load_zone(name: str) -> ZoneInfo:
    # Also not "localtime": whatever the host is configured with is not a zone a job can name.
    if name not in _zone_names():
        raise CronError("timezone", f"unknown IANA time zone {name!r}")
    try:
        return ZoneInfo(name)
    # OSError: a directory of zones ("America") or an unreadable file is not a zone either.
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise CronError("timezone", f"unknown IANA time zone {name!r}") from exc


def _check_field_chars(expression: str, name: str, value: str) -> None:
    upper = value.upper()
    names = _NAMES.get(name)
    if names is not None:
        upper = names.sub("", upper)
    for char in upper:
        if char not in _ALLOWED_CHARS[name]:
            if char == "H":
                reason = "hashed 'H' values are resolved from a job (app/domain/cron_hash.py), not here"
            elif char == "R":
                reason = "random 'R' values are not supported"
            else:
                reason = f"unexpected character {char!r}"
            raise CronError("cron", f"invalid cron expression {expression!r}: {name} field {value!r}: {reason}")


@dataclass(frozen=True)
class _Overlap:
    """A fall-back: wall times in [start_wall, end_wall) occur twice."""

    start_wall: dt.datetime
    end_wall: dt.datetime


def _fire_instants(matcher: WallMatcher, zone: ZoneInfo, after: dt.datetime) -> Iterator[dt.datetime]:
    """Every fire instant strictly after `after` (UTC), increasing, each instant once."""
    last = after
    for instant in _candidate_instants(matcher, zone, after):
        # Gap wall times collapse into one instant, which must fire once.
        if instant > last:
            last = instant
            yield instant


def _candidate_instants(matcher: WallMatcher, zone: ZoneInfo, after: dt.datetime) -> Iterator[dt.datetime]:
    """Fire instants in non-decreasing order, starting after `after`; may repeat an instant.

    Walls are enumerated in order, and the first occurrence of each maps to instants in the
    same order. Second occurrences (frequent schedules only) are the exception: those of
    one overlap all come after its first pass and before any later wall time, so they are
    held back until the enumeration leaves the overlap.
    """
    local_after = after.astimezone(zone)
    wall_after = local_after.replace(tzinfo=None)
    pending: _Overlap | None = None
    if _is_ambiguous(zone, wall_after):
        overlap = _overlap_at(zone, wall_after)
        if local_after.fold == 0:
            # In the first pass: the rest of it comes first, then the whole second pass,
            # including wall times earlier than `wall_after`.
            walls = matcher.walls(wall_after, inclusive=False)
            if matcher.frequent:
                pending = overlap
        else:
            # In the second pass: the first pass is over, so the rest of the second pass
            # comes first, then wall times from the end of the overlap.
            if matcher.frequent:
                yield from _second_pass(matcher, zone, overlap, wall_after, inclusive=False)
            walls = matcher.walls(overlap.end_wall, inclusive=True)
    else:
        walls = matcher.walls(wall_after, inclusive=False)

    for wall in walls:
        if pending is not None and wall >= pending.end_wall:
            yield from _second_pass(matcher, zone, pending, pending.start_wall, inclusive=True)
            pending = None
        if (plain := _unique_instant(zone, wall)) is not None:
            yield plain
        elif not _exists(zone, wall):
            yield _gap_end(zone, wall)
        elif _is_ambiguous(zone, wall):
            if matcher.frequent and pending is None:
                pending = _overlap_at(zone, wall)
            yield min(_instant(zone, wall, fold=0), _instant(zone, wall, fold=1))
        else:
            yield _instant(zone, wall, fold=0)
    # The expression stopped firing while an overlap was open.
    if pending is not None:
        yield from _second_pass(matcher, zone, pending, pending.start_wall, inclusive=True)


def _second_pass(
    matcher: WallMatcher, zone: ZoneInfo, overlap: _Overlap, start: dt.datetime, *, inclusive: bool
) -> Iterator[dt.datetime]:
    """Second occurrences (fold=1) of the matching wall times from `start` to the end of `overlap`."""
    for wall in matcher.walls(start, inclusive=inclusive):
        if wall >= overlap.end_wall:
            return
        yield _instant(zone, wall, fold=1)


def _unique_instant(zone: ZoneInfo, wall: dt.datetime) -> dt.datetime | None:
    """The one instant of `wall`, or None near a transition (in a gap or an overlap).

    The hot path: away from transitions both folds give the same offset, and the instant is
    one subtraction away.
    """
    offset = wall.replace(tzinfo=zone).utcoffset()
    if offset is None or offset != wall.replace(tzinfo=zone, fold=1).utcoffset():
        return None
    return (wall - offset).replace(tzinfo=UTC)


def _instant(zone: ZoneInfo, wall: dt.datetime, *, fold: int) -> dt.datetime:
    return wall.replace(tzinfo=zone, fold=fold).astimezone(UTC)


def _exists(zone: ZoneInfo, wall: dt.datetime) -> bool:
    # A wall time in a gap does not survive the round trip through UTC.
    return _instant(zone, wall, fold=0).astimezone(zone).replace(tzinfo=None) == wall


def _is_ambiguous(zone: ZoneInfo, wall: dt.datetime) -> bool:
    # Only meaningful for existing wall times: those in a gap also differ by fold.
    return (
        _unique_instant(zone, wall) is None
        and _exists(zone, wall)
        and (wall.replace(tzinfo=zone, fold=0).utcoffset() != wall.replace(tzinfo=zone, fold=1).utcoffset())
    )


def _gap_end(zone: ZoneInfo, wall: dt.datetime) -> dt.datetime:
    """The instant the clock resumes after the gap that swallows `wall`."""
    # The two readings of a missing wall time lie on either side of the transition.
    earlier, later = sorted((_instant(zone, wall, fold=0), _instant(zone, wall, fold=1)))
    return _transition_between(zone, earlier, later)


def _overlap_at(zone: ZoneInfo, wall: dt.datetime) -> _Overlap:
    """The fall-back whose repeated wall times include the ambiguous `wall`."""
    first = wall.replace(tzinfo=zone, fold=0)
    second = wall.replace(tzinfo=zone, fold=1)
    first_offset, second_offset = first.utcoffset(), second.utcoffset()
    assert first_offset is not None and second_offset is not None
    transition = _transition_between(zone, first.astimezone(UTC), second.astimezone(UTC))
    start_wall = transition.astimezone(zone).replace(tzinfo=None)
    return _Overlap(start_wall=start_wall, end_wall=start_wall + (first_offset - second_offset))


def _transition_between(zone: ZoneInfo, earlier: dt.datetime, later: dt.datetime) -> dt.datetime:
    """The instant in (earlier, later] from which `later`'s UTC offset applies.

    Assumes one transition in between, which holds for the two readings of one wall time.
    tzdata transitions fall on whole seconds, so a bisection over seconds is exact.
    """
    target = later.astimezone(zone).utcoffset()
    low = math.floor(earlier.timestamp())
    high = math.ceil(later.timestamp())
    while high - low > 1:
        middle = (low + high) // 2
        if dt.datetime.fromtimestamp(middle, tz=zone).utcoffset() == target:
            high = middle
        else:
            low = middle
    return dt.datetime.fromtimestamp(high, tz=UTC)
