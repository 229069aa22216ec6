"""The shape every background service shares: `run_once()` for tests, `run_forever()` for
processes, a jittered wait between passes, backoff while the database is unreachable, and a
clean stop."""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Protocol

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from app.logs import log_event

# Errors that mean "the database is unreachable right now": back off and try again.
TRANSIENT_DB_ERRORS = (OSError, OperationalError, InterfaceError, DBAPIError, ConnectionError)
MAX_ERROR_BACKOFF_S = 10.0


class Service(Protocol):
    name: str

    async def run_once(self) -> dict[str, int]: ...

    def idle_wait_s(self, counts: dict[str, int]) -> float: ...


async def run_forever(service: Service, stop: asyncio.Event, logger: logging.Logger) -> None:
    error_backoff = 0.5
    while not stop.is_set():
        try:
            counts = await service.run_once()
            error_backoff = 0.5
            wait = service.idle_wait_s(counts)
        except TRANSIENT_DB_ERRORS as exc:
            log_event(
                logger,
                f"{service.name}_db_unavailable",
                logging.WARNING,
                error=type(exc).__name__,
                retry_in_s=error_backoff,
            )
            wait = error_backoff
            error_backoff = min(error_backoff * 2, MAX_ERROR_BACKOFF_S)
        except Exception:
            logger.exception(f"{service.name}_pass_failed")
            wait = error_backoff
            error_backoff = min(error_backoff * 2, MAX_ERROR_BACKOFF_S)
        if wait > 0:
            # Jitter keeps replicas that started together from polling in lockstep.
            wait *= random.uniform(0.8, 1.2)
            try:
                await asyncio.wait_for(stop.wait(), timeout=wait)
            except TimeoutError:
                pass
