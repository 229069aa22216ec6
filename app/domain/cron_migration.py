"""Which stored cron schedules fire differently since cron fields mean what Vixie cron means.

Before that fix (issue 13) cronhook let croniter enumerate wall times: with croniter 7 a
one-value range (`9-9`) was the whole field, day-of-month and day-of-week always combined by
OR (except with `#`, which did neither), `31W` in a shorter month meant the weekday nearest
its last day, and some forms were rejected (`LW`, `5L`) or accepted with another meaning.
`compare` evaluates an expression both ways from the same instant, with the same DST policy,
and says whether the next fire times differ. Pure: `after` is passed in.

LEGACY: `_LegacyMatcher` and `_legacy_frequent` reproduce the old evaluation with the
installed croniter and exist only for this comparison (`cronhook cron-check`). Nothing else
may use them; delete them with the command once no stored job predates the fix.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator
from dataclasses import dataclass

from croniter import CroniterBadDateError, CroniterError, croniter
from croniter.croniter import HOUR_FIELD

from app.domain.cron import (
    ALIASES,
    MAX_YEARS_BETWEEN_FIRES,
    CronError,
    fire_times,
    load_zone,
    parse_cron,
    upcoming,
)

DEFAULT_FIRES = 20


@dataclass(frozen=True)
class CronChange:
    """How one (expression, zone) fires from `after`, before and after the fix.

    A side that rejects the expression (or finds no fire time) has an error instead of fires.
    """

    expression: str
    timezone: str
    old_fires: tuple[dt.datetime, ...]
    new_fires: tuple[dt.datetime, ...]
    old_error: str | None
    new_error: str | None
    # False: the old code refused the expression, so no job stored before the fix has it.
    old_accepted: bool = True

    @property
    def changed(self) -> bool:
        return (self.old_fires, self.old_error is None) != (self.new_fires, self.new_error is None)

    @property
    def first_difference(self) -> int | None:
        """Index of the first fire time that differs (or that one side lacks)."""
        if not self.changed:
            return None
        for index, (old, new) in enumerate(zip(self.old_fires, self.new_fires, strict=False)):
            if old != new:
                return index
        return min(len(self.old_fires), len(self.new_fires))


def compare(expression: str, timezone: str, after: dt.datetime, count: int = DEFAULT_FIRES) -> CronChange:
    """The next `count` fire times of `expression` in `timezone` after `after`, old and new."""
    new_fires: list[dt.datetime] = []
    new_error = old_error = None
    try:
        new_fires = _new_fires(expression, timezone, after, count)
    except CronError as exc:
        new_error = exc.message
    old_accepted = True
    try:
        old_fires = _legacy_fires(expression, timezone, after, count)
        if not old_fires:
            old_error = f"never fires (no fire time within {MAX_YEARS_BETWEEN_FIRES} years)"
    except CronError as exc:
        old_fires, old_error, old_accepted = [], exc.message, False
    return CronChange(expression, timezone, tuple(old_fires), tuple(new_fires), old_error, new_error, old_accepted)


def _new_fires(expression: str, timezone: str, after: dt.datetime, count: int) -> list[dt.datetime]:
    return upcoming(parse_cron(expression), timezone, after, count)


def _legacy_fires(expression: str, timezone: str, after: dt.datetime, count: int) -> list[dt.datetime]:
    zone = load_zone(timezone)
    fields = re.findall(r"\S+", expression, re.ASCII)
    if len(fields) == 1 and fields[0].lower() in ALIASES:
        fields = ALIASES[fields[0].lower()].split()
    normalised = " ".join(fields)
    has_seconds = len(fields) == 6
    try:
        frequent = _legacy_frequent(normalised, has_seconds)
    except CroniterError as exc:
        raise CronError("cron", f"croniter rejected it: {str(exc).strip().splitlines()[0]}") from exc
    return fire_times(_LegacyMatcher(normalised, has_seconds, frequent), zone, after, count)


def _legacy_frequent(normalised: str, has_seconds: bool) -> bool:
    """LEGACY: the old parse_cron's test, croniter turning an every-hour field into ["*"]."""
    expanded, _ = croniter.expand(normalised, second_at_beginning=has_seconds)
    return bool(expanded[HOUR_FIELD] == ["*"])


@dataclass(frozen=True)
class _LegacyMatcher:
    """LEGACY: the wall times croniter enumerated for the old app/domain/cron.py."""

    expression: str
    has_seconds: bool
    frequent: bool

    def walls(self, start: dt.datetime, *, inclusive: bool) -> Iterator[dt.datetime]:
        # As before: croniter works in float timestamps, so whole seconds only.
        begin = start.replace(microsecond=0)
        if inclusive and begin == start:
            begin -= dt.timedelta(seconds=1)
        walls = croniter(
            self.expression,
            begin,
            ret_type=dt.datetime,
            max_years_between_matches=MAX_YEARS_BETWEEN_FIRES,
            second_at_beginning=self.has_seconds,
        )
        while True:
            try:
                wall = walls.get_next(dt.datetime)
            except CroniterBadDateError:
                return
            yield wall
