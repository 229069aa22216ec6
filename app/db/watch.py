"""The database operations of this process in flight, and its last commit: what the stall
reporter (app/services/db_health.py) warns about and what readiness answers from.

A database can accept connections and answer reads while never returning a commit (a
synchronous standby gone, a full WAL disk, a frozen volume) or hold a statement behind a
lock; nothing fails, deliveries just stop. The hot paths mark their operations here with
`with DB_WATCH.operation("claim"):` (two clock reads and a set insert, no I/O), so a stall
shows as an operation that has not returned; the commit probe's commits are the readiness
signal.

One instance per process, like the metrics registry: the operations it watches live deep in
the services, and the probes that read it are the process's own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from types import TracebackType


@dataclass(frozen=True)
class InFlight:
    name: str
    age_s: float


class _Operation:
    __slots__ = ("_watch", "name", "started")

    def __init__(self, watch: DbWatch, name: str) -> None:
        self._watch = watch
        self.name = name
        self.started = 0.0

    def __enter__(self) -> _Operation:
        self.started = time.monotonic()
        self._watch._in_flight.add(self)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._watch._in_flight.discard(self)


class DbWatch:
    """Operations in flight (by name and start) and when the last commit probe committed."""

    def __init__(self) -> None:
        self._in_flight: set[_Operation] = set()
        self.role = "cronhook"
        # Start-up counts as a commit: a process is given the readiness window to make its first.
        self.last_commit = time.monotonic()
        # The API's view of the cluster (app/services/db_health.py): None until first read.
        self.schedulers_live: bool | None = None
        # `cronhook up` at start-up: why its schedulers' partitions are not settled yet (None:
        # not waited for, or settled once; start-up is then over for good).
        self.starting: str | None = None

    def operation(self, name: str) -> _Operation:
        return _Operation(self, name)

    def committed(self, at: float | None = None) -> None:
        self.last_commit = time.monotonic() if at is None else at

    def oldest(self, now: float | None = None) -> InFlight | None:
        """The operation in flight the longest, if any."""
        if not self._in_flight:
            return None
        now = time.monotonic() if now is None else now
        first = min(self._in_flight, key=lambda op: op.started)
        return InFlight(first.name, max(0.0, now - first.started))

    def since_commit_s(self, now: float | None = None) -> float:
        return (time.monotonic() if now is None else now) - self.last_commit

    def reset(self, role: str) -> None:
        """A process (or a test) starting its services afresh."""
        self._in_flight.clear()
        self.role = role
        self.last_commit = time.monotonic()
        self.schedulers_live = None
        self.starting = None


def readiness(watch: DbWatch, warn_s: float, now: float | None = None) -> str | None:
    """None when ready; else why not, for /readyz. Not ready once no commit has completed
    for three stall-warning periods (the probe commits every half period)."""
    since = watch.since_commit_s(now)
    if since > 3 * warn_s:
        oldest = watch.oldest(now)
        waiting = f"; oldest operation in flight: {oldest.name}, {oldest.age_s:.0f} s" if oldest else ""
        return f"no database commit has completed for {since:.0f} s{waiting}"
    if watch.schedulers_live is False:
        return "no scheduler of the cluster has heartbeated within its lease"
    if watch.starting:
        # Ready now, a job due in the next seconds could wait for a partition's first owner.
        return f"starting: {watch.starting}"
    return None


DB_WATCH = DbWatch()
