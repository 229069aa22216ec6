"""The database's clock as one scheduler process knows it: the offset between PostgreSQL's
clock (what due times are on) and the local monotonic clock (what waits run on), bounded from
readings the claims bring back. Pure: the caller passes the local times in.

Each claim returns the database's clock as it sent its last row (`clock_timestamp()`), read
before the answer reached this process. So for any one claim, the true offset (local
monotonic time minus database time) is at most `received_mono - db_at`: a wait planned with
that bound ends at the due time or after it, never before. One claim's bound is loose by
everything that came after the reading (the statement's AFTER triggers, its commit, the way
back, the decoding: ~4-5 ms at 1,000 due/s, every job that late), but the offset itself is
the same for all claims, so the smallest bound among recent claims is the tightest one that
is still safe. Readings older than WINDOW_S are dropped: the two clocks may drift apart
(NTP slews the database's by up to 500 ppm, 0.5 ms a second) or the database's may be
stepped, and an old bound would then let a wait end early.
"""

from __future__ import annotations

import collections
import datetime as dt

# How long a claim's reading counts: at 1,000 due/s a scheduler claims ~20 times a second.
WINDOW_S = 1.0


class DbClock:
    def __init__(self, window_s: float = WINDOW_S) -> None:
        self._window_s = window_s
        # (received_mono, bound), bounds increasing from the front: the front is the minimum.
        self._bounds: collections.deque[tuple[float, float]] = collections.deque()

    def observe(self, received_mono: float, db_at: dt.datetime) -> None:
        """A claim read the database's clock as `db_at`, and its answer was in hand at local
        monotonic time `received_mono`."""
        bound = received_mono - db_at.timestamp()
        # A later reading with a bound as tight or tighter makes the earlier ones useless.
        while self._bounds and self._bounds[-1][1] >= bound:
            self._bounds.pop()
        self._bounds.append((received_mono, bound))
        while self._bounds[0][0] < received_mono - self._window_s:
            self._bounds.popleft()

    def offset_s(self) -> float | None:
        """Local monotonic time minus the database's time, as an upper bound (None: no
        reading yet). Mapped with it, a database time is reached locally no earlier than it
        is on the database."""
        return self._bounds[0][1] if self._bounds else None


def until_s(db_at: dt.datetime, offset_s: float, now_mono: float) -> float:
    """Seconds until the database's clock reaches `db_at` (<= 0: reached), erring late."""
    return db_at.timestamp() + offset_s - now_mono


def db_now(offset_s: float, now_mono: float) -> dt.datetime:
    """The database's time at local monotonic time `now_mono`, or a little before it."""
    return dt.datetime.fromtimestamp(now_mono - offset_s, dt.UTC)
