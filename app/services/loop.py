"""The shape every background service shares: `run_once()` for tests, `run_forever()` for
processes, a jittered wait between passes, backoff while the database is unreachable, and a
clean stop."""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Protocol

from app.db.errors import is_transient_db_error
from app.logs import log_event

MIN_ERROR_BACKOFF_S = 0.5
MAX_ERROR_BACKOFF_S = 10.0


class Service(Protocol):
    name: str
    # Set to cut an idle wait short (the scheduler: a delivery slot came free).
    wake: asyncio.Event

    async def tick(self) -> dict[str, int]:
        """One pass as run_forever wants it (may leave work running in the background)."""
        ...

    def idle_wait_s(self, counts: dict[str, int]) -> float: ...


async def run_forever(service: Service, stop: asyncio.Event, logger: logging.Logger) -> None:
    error_backoff = MIN_ERROR_BACKOFF_S
    while not stop.is_set():
        try:
            counts = await service.tick()
            error_backoff = MIN_ERROR_BACKOFF_S
            wait = service.idle_wait_s(counts)
        except Exception as exc:
            log_pass_failure(logger, service.name, exc, error_backoff)
            wait = error_backoff
            error_backoff = min(error_backoff * 2, MAX_ERROR_BACKOFF_S)
        if wait > 0:
            # Jitter keeps replicas that started together from polling in lockstep.
            await wait_for_stop_or_wake(stop, service.wake, wait * random.uniform(0.8, 1.2))


def log_pass_failure(logger: logging.Logger, name: str, exc: Exception, retry_in_s: float) -> None:
    if is_transient_db_error(exc):
        log_event(logger, f"{name}_db_unavailable", logging.WARNING, error=type(exc).__name__, retry_in_s=retry_in_s)
    else:
        logger.exception(f"{name}_pass_failed")


async def wait_for_stop_or_wake(stop: asyncio.Event, wake: asyncio.Event, wait_s: float) -> None:
    waiters = [asyncio.create_task(stop.wait()), asyncio.create_task(wake.wait())]
    await asyncio.wait(waiters, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
    for task in waiters:
        task.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)
