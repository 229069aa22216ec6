"""The shape every background service shares: `run_once()` for tests, returning a frozen
result with named counts; `run_forever()` for processes, with a jittered wait between
passes, backoff while the database is unreachable (logged once per outage, not once per
attempt), and a clean stop.

How the loop sleeps is a hook, `WaitPolicy`: the default jitters every wait; the scheduler
is its own policy (its wait ends exactly at the next due time, app/services/scheduler.py).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import Protocol, TypeVar

from app.db.errors import is_transient_db_error, outage_reason
from app.logs import log_event

MIN_ERROR_BACKOFF_S = 0.5
MAX_ERROR_BACKOFF_S = 10.0

_Result = TypeVar("_Result")


class Service(Protocol[_Result]):
    name: str
    # Set to cut an idle wait short (the scheduler: a delivery slot came free).
    wake: asyncio.Event

    async def tick(self) -> _Result:
        """One pass as run_forever wants it (may leave work running in the background)."""
        ...

    def idle_wait_s(self, result: _Result) -> float: ...


class WaitPolicy(Protocol):
    def sleep_s(self, wait_s: float, failed: bool) -> float:
        """How long to sleep when the pass asks to wait `wait_s` (`failed`: the error backoff)."""
        ...

    def sleeping(self, sleep_s: float | None) -> None:
        """The loop is about to sleep `sleep_s`; None: it is awake and runs the next pass."""
        ...


def jittered(wait_s: float, rng: random.Random) -> float:
    # Jitter keeps replicas that started together from polling in lockstep.
    return wait_s * rng.uniform(0.8, 1.2)


class Jittered:
    """The default wait policy: every wait jittered, the error backoff included."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()

    def sleep_s(self, wait_s: float, failed: bool) -> float:
        return jittered(wait_s, self._rng)

    def sleeping(self, sleep_s: float | None) -> None:
        pass


class OutageLog:
    """Logs a database outage once per episode: `{name}_db_unavailable` at the first failed
    pass (with the reason), `{name}_db_recovered` at the first pass that succeeds after it
    (with how long it lasted and how many passes failed); the attempts between are DEBUG."""

    def __init__(self, logger: logging.Logger, name: str) -> None:
        self._logger = logger
        self._name = name
        self._since: float | None = None
        self._failures = 0

    def failed(self, exc: Exception, retry_in_s: float) -> None:
        if not is_transient_db_error(exc):
            self._logger.exception(f"{self._name}_pass_failed")
            return
        self._failures += 1
        first = self._since is None
        if first:
            self._since = time.monotonic()
        log_event(
            self._logger,
            f"{self._name}_db_unavailable",
            logging.WARNING if first else logging.DEBUG,
            reason=outage_reason(exc),
            error=type(exc).__name__,
            retry_in_s=retry_in_s,
        )

    def succeeded(self) -> None:
        if self._since is None:
            return
        lasted_s = time.monotonic() - self._since
        log_event(
            self._logger,
            f"{self._name}_db_recovered",
            logging.WARNING,
            lasted_s=round(lasted_s, 1),
            failed_passes=self._failures,
        )
        self._since, self._failures = None, 0


async def run_forever(
    service: Service[_Result],
    stop: asyncio.Event,
    logger: logging.Logger,
    max_error_backoff_s: float = MAX_ERROR_BACKOFF_S,
    wait_policy: WaitPolicy | None = None,
) -> None:
    """`max_error_backoff_s`: the longest wait between failed passes (the commit probe keeps
    it short, so readiness returns soon after the database does); `wait_policy`: how the
    waits are slept (default: Jittered)."""
    policy = wait_policy or Jittered()
    first_backoff = min(MIN_ERROR_BACKOFF_S, max_error_backoff_s)
    error_backoff = first_backoff
    outage = OutageLog(logger, service.name)
    while not stop.is_set():
        try:
            result = await service.tick()
            outage.succeeded()
            error_backoff = first_backoff
            sleep_s = policy.sleep_s(service.idle_wait_s(result), failed=False)
        except Exception as exc:
            outage.failed(exc, error_backoff)
            sleep_s = policy.sleep_s(error_backoff, failed=True)
            error_backoff = min(error_backoff * 2, max_error_backoff_s)
        # Woken during the pass (a delivery slot came free, a job fell due): no sleep at all.
        if sleep_s > 0 and not service.wake.is_set():
            policy.sleeping(sleep_s)
            await wait_for_stop_or_wake(stop, service.wake, sleep_s)
        policy.sleeping(None)


async def wait_for_stop_or_wake(stop: asyncio.Event, wake: asyncio.Event, wait_s: float) -> None:
    waiters = [asyncio.create_task(stop.wait()), asyncio.create_task(wake.wait())]
    await asyncio.wait(waiters, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
    for task in waiters:
        task.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)
