"""The reaper: rescues jobs whose lease expired (their scheduler died or stalled mid-delivery).

A rescued lease counts as a failed attempt: the job goes to `retrying` with backoff, or to
the dead-letter queue when its attempts are exhausted. Several reapers may run at once:
SKIP LOCKED gives each expired job to one of them, and the lease-token guard makes the
update a no-op if the original scheduler records its outcome first.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncEngine

from app import metrics
from app.domain.job import AttemptOutcome, FinishedAttempt, RunOutcome
from app.domain.lifecycle import after_attempt
from app.logs import log_event
from app.settings import Settings, default_of
from app.store.claims import job_lock_expired_leases
from app.store.idempotency import idempotency_key_purge_expired
from app.store.outcomes import job_finish_attempts

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReaperConfig:
    interval_s: float = default_of("reaper_interval_s")
    batch_size: int = default_of("reaper_batch_size")

    def __post_init__(self) -> None:
        if self.interval_s <= 0 or self.batch_size < 1:
            raise ValueError("interval_s and batch_size must be positive")

    @classmethod
    def from_settings(cls, settings: Settings) -> ReaperConfig:
        return cls(interval_s=settings.reaper_interval_s, batch_size=settings.reaper_batch_size)


class Reaper:
    name = "reaper"

    def __init__(self, engine: AsyncEngine, config: ReaperConfig, rng: random.Random | None = None) -> None:
        self._engine = engine
        self.config = config
        self._rng = rng or random.Random()
        self.wake = asyncio.Event()

    async def tick(self) -> dict[str, int]:
        return await self.run_once()

    async def run_once(self) -> dict[str, int]:
        counts = {"rescued": 0, "dead_lettered": 0}
        async with self._engine.begin() as conn:
            expired = await job_lock_expired_leases(conn, self.config.batch_size)
            items = [
                FinishedAttempt(
                    job,
                    AttemptOutcome(
                        RunOutcome.LEASE_EXPIRED,
                        error=f"lease held by {job.lease_owner} expired before an outcome was recorded",
                    ),
                    after_attempt(job.attempt_context(), False, job.claimed_at, self._rng),
                )
                for job in expired
            ]
            # We hold the rows' locks, so every one applies; the guard stays as a backstop.
            applied = await job_finish_attempts(conn, items)
        for item in items:
            if item.lease not in applied:
                continue
            counts["dead_lettered" if item.step.dead_letter else "rescued"] += 1
            log_event(
                logger,
                "lease_reaped",
                job_id=str(item.job.id),
                lease_owner=item.job.lease_owner,
                attempt=item.job.attempt,
                state=item.step.state.value,
                dead_letter=item.step.dead_letter,
            )
        metrics.leases_reaped(counts["rescued"], counts["dead_lettered"])
        # Housekeeping rides along, after the rescue so it can never hold one up: Idempotency-Keys
        # are kept for 24 hours.
        async with self._engine.begin() as conn:
            counts["idempotency_keys_purged"] = await idempotency_key_purge_expired(conn)
        return counts

    def idle_wait_s(self, counts: dict[str, int]) -> float:
        if counts["rescued"] + counts["dead_lettered"] >= self.config.batch_size:
            return 0.0
        return self.config.interval_s
