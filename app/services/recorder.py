"""Group commit for delivery outcomes.

Deliveries finish one by one, but recording each in its own transaction made the database,
not HTTP, the bottleneck (bench/). A delivery hands its outcome to `record()` and waits;
whatever has accumulated while the previous batch was being written goes out as the next
batch, in one transaction. Under light load a batch is a single outcome, so nothing waits
on a timer.

In between, at a steady few hundred deliveries a second, each write would carry a handful of
outcomes, and a statement's fixed cost dominated: at 1,000 due/s the outcome statements alone
took ~0.2 of PostgreSQL's cores. So while outcomes arrive fast enough that waiting
LINGER_MAX_S would bring at least LINGER_MIN_GAIN more, a small batch waits for them (the
delivery keeps its slot meanwhile; the POST has been answered already).
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
# A batch this large goes out at once; a smaller one may wait up to LINGER_MAX_S for more,
# when the arrival rate says at least LINGER_MIN_GAIN more would come in that time.
LINGER_FULL_BATCH = 32
LINGER_MAX_S = 0.025
LINGER_MIN_GAIN = 4
# The arrival rate's memory (an exponentially weighted mean of the gaps between outcomes),
# and the longest gap it counts (an idle minute is not 60 times less likely to be followed).
_GAP_WEIGHT = 0.1
_GAP_CAP_S = 1.0


# An attempt's outcome, or an async delivery's 202 (the attempt stays open).
Recorded = FinishedAttempt | OpenedAttempt


@dataclass
class _Pending:
    item: Recorded
    # Monotonic time after which recording is pointless: the lease has expired and the
    # reaper owns the job (recording would be fenced anyway).
    deadline: float
    done: asyncio.Future[bool]


class BatchLinger:
    """How long a batch waits for more outcomes, from the rate they have been arriving at."""

    def __init__(self) -> None:
        self._last_arrival = float("-inf")
        self._mean_gap_s = _GAP_CAP_S

    def arrived(self, now: float) -> None:
        gap = min(now - self._last_arrival, _GAP_CAP_S)
        self._last_arrival = now
        self._mean_gap_s += _GAP_WEIGHT * (gap - self._mean_gap_s)

    def wait_s(self, pending: int) -> float:
        """How long a batch of `pending` outcomes waits for more before it is written: only
        while the arrival rate promises at least LINGER_MIN_GAIN more within LINGER_MAX_S, and
        no longer than the batch takes to fill at that rate."""
        if pending >= LINGER_FULL_BATCH or LINGER_MAX_S < LINGER_MIN_GAIN * self._mean_gap_s:
            return 0.0
        return min(LINGER_MAX_S, (LINGER_FULL_BATCH - pending) * self._mean_gap_s)


class OutcomeRecorder:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._pending: list[_Pending] = []
        self._writer: asyncio.Task[None] | None = None
        self._linger = BatchLinger()

    async def record(self, item: Recorded, deadline: float) -> bool:
        """True once applied; False when fenced or when the database stayed unreachable."""
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(item, deadline, done))
        self._linger.arrived(time.monotonic())
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_all())
        return await done

    async def _write_all(self) -> None:
        backoff = 0.1
        while self._pending:
            linger_s = self._linger.wait_s(len(self._pending))
            if linger_s > 0:
                await asyncio.sleep(linger_s)
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
