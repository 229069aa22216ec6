"""A schedule's fire times, counted within bounds, for app/domain/occurrences.py. Pure.

A job every second that was down for a year has 31M missed fire times, so nothing here
walks a backlog one fire time at a time. Interval fire times are a grid, counted
arithmetically (O(1)). Cron fire times are enumerated at most CRON_COUNT_BUDGET at a time;
past that a Skipped is flagged truncated and its total is a lower bound. Which occurrence
to deliver never depends on that count: it is found by jumping, either "first fire time
after t" or a search backwards from `now` (CronTimes.kth_latest), so the decision stays
exact however large the backlog.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from typing import Final, Protocol

from app.domain.cron import MAX_UPCOMING, CronSpec, parse_cron, upcoming
from app.domain.schedule import CronSchedule, IntervalSchedule, ScheduleError, next_cron_fire, next_interval_fire

UTC = dt.UTC

# At most this many skipped fire times are returned one by one; counts stay exact or
# are flagged truncated.
MAX_RECORDED_SKIPS: Final = 100
# A cron backlog is enumerated up to this many fire times (about 0.1 s) to count it; a
# larger one gets a lower-bound total flagged truncated.
CRON_COUNT_BUDGET: Final = 2_000


@dataclass(frozen=True)
class Skipped:
    times: tuple[dt.datetime, ...]  # the first MAX_RECORDED_SKIPS skipped nominal fire times, ascending
    total: int  # how many were skipped (exact when not truncated)
    truncated: bool  # True when counting was cut off (cron over a huge window); then total is a lower bound


NO_SKIPS: Final = Skipped((), 0, False)


class FireTimes(Protocol):
    """A schedule's fire times, queried only at or after the occurrence being planned."""

    def following(self, after: dt.datetime) -> dt.datetime:
        """The first fire time strictly after `after`."""
        ...

    def span(self, low: dt.datetime, high: dt.datetime) -> Skipped:
        """The fire times in (low, high]: the first MAX_RECORDED_SKIPS of them and their count."""
        ...

    def kth_latest(self, low: dt.datetime, high: dt.datetime, k: int) -> dt.datetime | None:
        """The k-th latest fire time in (low, high] (k=1: the latest), or None if fewer are there."""
        ...


@dataclass(frozen=True)
class IntervalTimes:
    """The grid origin + k * every_s, k >= 1 (as next_interval_fire counts it), in O(1)."""

    schedule: IntervalSchedule
    origin: dt.datetime

    def following(self, after: dt.datetime) -> dt.datetime:
        return next_interval_fire(self.schedule, self.origin, after)

    def span(self, low: dt.datetime, high: dt.datetime) -> Skipped:
        first, last = self._index_after(low), self._index_at_or_before(high)
        total = max(0, last - first + 1)
        times = tuple(self._at(index) for index in range(first, first + min(total, MAX_RECORDED_SKIPS)))
        return Skipped(times, total, truncated=False)

    def kth_latest(self, low: dt.datetime, high: dt.datetime, k: int) -> dt.datetime | None:
        first, last = self._index_after(low), self._index_at_or_before(high)
        return self._at(last - k + 1) if last - first + 1 >= k else None

    def _step(self) -> dt.timedelta:
        return dt.timedelta(seconds=self.schedule.every_s)

    def _at(self, index: int) -> dt.datetime:
        return (self.origin + index * self._step()).astimezone(UTC)

    def _index_at_or_before(self, instant: dt.datetime) -> int:
        # timedelta // timedelta is exact integer floor division, however long the outage.
        return max(0, (instant - self.origin) // self._step())

    def _index_after(self, instant: dt.datetime) -> int:
        return self._index_at_or_before(instant) + 1


class CronTimes:
    """Cron fire times (DST policy in app/domain/cron.py), enumerated within a budget."""

    def __init__(self, schedule: CronSchedule) -> None:
        self.schedule = schedule
        self.spec: CronSpec = parse_cron(schedule.expression)

    def following(self, after: dt.datetime) -> dt.datetime:
        return next_cron_fire(self.schedule, after)

    def span(self, low: dt.datetime, high: dt.datetime) -> Skipped:
        times: list[dt.datetime] = []
        total = 0
        cursor = low
        # Batches grow so that a short window of a sparse schedule stays cheap.
        batch = 16
        while cursor < high:
            wanted = min(batch, MAX_UPCOMING)
            fires = self._after(cursor, wanted)
            for fire in fires:
                if fire > high:
                    return Skipped(tuple(times), total, truncated=False)
                if total == CRON_COUNT_BUDGET:
                    return Skipped(tuple(times), total, truncated=True)
                total += 1
                if len(times) < MAX_RECORDED_SKIPS:
                    times.append(fire)
            if len(fires) < wanted:  # the expression stopped firing
                break
            cursor = fires[-1]
            batch *= 4
        return Skipped(tuple(times), total, truncated=False)

    def kth_latest(self, low: dt.datetime, high: dt.datetime, k: int) -> dt.datetime | None:
        """Searches backwards from `high` instead of enumerating from `low`.

        An exponential search for the smallest whole number of seconds `back` such that
        (high - back, high] holds k fire times, then a bisection. Cron fire instants are
        whole seconds (app/domain/cron.py), so the one-second slice (high - back, high -
        back + 1s] then holds exactly the k-th latest. A dense backlog, the only kind that
        is large, takes a few probes; a year of daily fires about 50, each enumerating k.
        """
        if not self._holds(low, high, k):
            return None
        limit = math.ceil((high - low) / dt.timedelta(seconds=1))

        def start(back: int) -> dt.datetime:
            return max(low, high - dt.timedelta(seconds=back))

        near, far = 0, 1  # (start(near), high] holds fewer than k; (start(far), high] may hold k
        while far < limit and not self._holds(start(far), high, k):
            near, far = far, min(far * 2, limit)
        while far - near > 1:
            middle = (near + far) // 2
            if self._holds(start(middle), high, k):
                far = middle
            else:
                near = middle
        return self._after(start(far), 1)[0]

    def _holds(self, low: dt.datetime, high: dt.datetime, k: int) -> bool:
        """Whether (low, high] holds at least k fire times."""
        fires = self._after(low, k)
        return len(fires) == k and fires[-1] <= high

    def _after(self, after: dt.datetime, count: int) -> list[dt.datetime]:
        try:
            return upcoming(self.spec, self.schedule.timezone, after, count)
        except ScheduleError:
            # No fire time left (the year-9999 end of datetime): the sequence is over.
            return []
