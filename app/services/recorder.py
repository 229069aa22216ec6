"""Group commit for delivery outcomes.

Deliveries finish one by one, but recording each in its own transaction made the database,
not HTTP, the bottleneck (bench/). A delivery hands its outcome to `record()` and waits;
whatever has accumulated while the previous batch was being written goes out as the next
batch, in one transaction. Under light load a batch is a single outcome, so nothing waits
on a timer.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass

from app.db.async_engine import AsyncEngine
from app.db.errors import is_transient_db_error
from app.db.watch import DB_WATCH
from app.domain.job import FinishedAttempt, OpenedAttempt
from app.logs import log_event
from app.store.completions import job_open_async_attempts
from app.store.outcomes import finish_is_one_statement, job_finish_attempts

logger = logging.getLogger(__name__)

MAX_BATCH = 500


# An attempt's outcome, or an async delivery's 202 (the attempt stays open).
Recorded = FinishedAttempt | OpenedAttempt


@dataclass
class _Pending:
    item: Recorded
    # Monotonic time after which recording is pointless: the lease has expired and the
    # reaper owns the job (recording would be fenced anyway).
    deadline: float
    done: asyncio.Future[bool]


class OutcomeRecorder:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._pending: list[_Pending] = []
        self._writer: asyncio.Task[None] | None = None

    async def record(self, item: Recorded, deadline: float) -> bool:
        """True once applied; False when fenced or when the database stayed unreachable."""
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(item, deadline, done))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_all())
        return await done

    async def _write_all(self) -> None:
        backoff = 0.1
        while self._pending:
            batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
            try:
                applied = await self._write([p.item for p in batch])
            except Exception as exc:
                if not is_transient_db_error(exc):
                    await self._write_one_by_one(batch)
                    continue
                # The POSTs happened: keep trying until their leases would have expired.
                now = time.monotonic()
                keep = []
                for pending in batch:
                    if now + backoff < pending.deadline:
                        keep.append(pending)
                    else:
                        log_event(
                            logger,
                            "outcome_not_recorded",
                            logging.ERROR,
                            job_id=str(pending.item.job.id),
                            error=type(exc).__name__,
                        )
                        if not pending.done.done():
                            pending.done.set_result(False)
                self._pending = keep + self._pending
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            backoff = 0.1
            for pending in batch:
                if not pending.done.done():
                    pending.done.set_result(pending.item.lease in applied)

    async def _write(self, items: list[Recorded]) -> set[tuple[uuid.UUID, uuid.UUID]]:
        with DB_WATCH.operation("outcome_batch"):
            return await self._write_batch(items)

    async def _write_batch(self, items: list[Recorded]) -> set[tuple[uuid.UUID, uuid.UUID]]:
        finished = [item for item in items if isinstance(item, FinishedAttempt)]
        if len(finished) < len(items):
            opened = [item for item in items if isinstance(item, OpenedAttempt)]
            async with self._engine.begin() as conn:
                return await job_finish_attempts(conn, finished) | await job_open_async_attempts(conn, opened)
        if not finish_is_one_statement(finished):
            async with self._engine.begin() as conn:
                return await job_finish_attempts(conn, finished)
        # One statement is atomic on its own: no BEGIN and COMMIT round trips.
        async with self._engine.connect() as conn:
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            return await job_finish_attempts(conn, finished)

    async def _write_one_by_one(self, batch: list[_Pending]) -> None:
        """After a non-transient error, isolate the bad outcome so it cannot sink the others."""
        for pending in batch:
            try:
                applied = await self._write_batch([pending.item])
            except Exception as exc:
                if is_transient_db_error(exc):
                    # The database went away meanwhile: back to the queue, retried with backoff.
                    self._pending.append(pending)
                    continue
                log_event(
                    logger, "outcome_rejected", logging.ERROR, job_id=str(pending.item.job.id), error=type(exc).__name__
                )
                if not pending.done.done():
                    pending.done.set_exception(exc)
                continue
            if not pending.done.done():
                pending.done.set_result(pending.item.lease in applied)

    async def drain(self) -> None:
        """Waits for outcomes already handed over to be written (shutdown)."""
        if self._writer is not None:
            await asyncio.gather(self._writer, return_exceptions=True)
