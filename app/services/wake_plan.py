"""When an idle scheduler wakes: at the next due time it learnt from its last claim, or
earlier when a NOTIFY (app/services/due_listener.py) announces a job due before that; at
most one poll interval later either way. The claim takes jobs due within `ahead_s`
(SchedulerConfig.claim_ahead_s); after one that drained that horizon, the next waits until
the next due job is only half of it away, so that in a steady stream each claim takes half
a horizon's worth (at 1,000 due/s, claims every ~5 ms for a few jobs each had cost
PostgreSQL ~0.2 of a core) and every job is still claimed at least `ahead_s / 2` before it is
due. A NOTIFY of a new job wakes a whole `ahead_s` before its due time.

Due times come on the database's clock; waits run on the local monotonic clock. They are
mapped with the scheduler process's DbClock (app/domain/db_clock.py), the same mapping the
deliveries' waits use: a wake-up errs late, never early.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time

from app.domain.db_clock import DbClock


class WakePlan:
    def __init__(self, wake: asyncio.Event, clock: DbClock, ahead_s: float = 0.0) -> None:
        self._wake = wake
        self._clock = clock
        self._ahead_s = ahead_s
        self._next_due_mono: float | None = None
        self._planned_mono: float | None = None
        self._timer: asyncio.TimerHandle | None = None

    def forget_next_due(self) -> None:
        self._next_due_mono = None

    def note_next_due(self, next_due_at: dt.datetime | None) -> None:
        """The next due time a claim reported (after the clock saw that claim's reading)."""
        offset_s = self._clock.offset_s()
        if next_due_at is not None and offset_s is not None:
            self._next_due_mono = next_due_at.timestamp() + offset_s - self._ahead_s / 2

    def wait_s(self, poll_interval_s: float) -> float:
        """How long to sleep: until the next known due time, at most one poll interval."""
        if self._next_due_mono is None:
            return poll_interval_s
        return min(poll_interval_s, max(0.0, self._next_due_mono - time.monotonic()))

    def planned(self, wait_s: float | None) -> None:
        """The loop is about to sleep `wait_s` (None: it is awake and claiming)."""
        self._planned_mono = None if wait_s is None else time.monotonic() + wait_s

    def on_due(self, due_epoch_s: float | None) -> None:
        """A job became due at `due_epoch_s` (None: notices may have been lost): wake at that
        time when it is earlier than the planned wake-up."""
        offset_s = self._clock.offset_s()
        if due_epoch_s is None or offset_s is None:
            self._wake.set()
            return
        due_mono = due_epoch_s + offset_s - self._ahead_s
        if self._planned_mono is not None and due_mono >= self._planned_mono:
            return
        self._planned_mono = due_mono
        self.cancel()
        delay = due_mono - time.monotonic()
        if delay <= 0:
            self._wake.set()
        else:
            self._timer = asyncio.get_running_loop().call_later(delay, self._wake.set)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
