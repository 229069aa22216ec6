"""The reaper: rescues jobs whose lease expired (their scheduler died or stalled mid-delivery),
and those of a replica whose death is certain (heartbeat and partition leases expired) at
once, without waiting out their job lease; then deletes old history (app/store/retention.py).

A rescued lease counts as a failed attempt: the job goes to `retrying` with backoff, or to
the dead-letter queue when its attempts are exhausted. Several reapers may run at once:
SKIP LOCKED gives each expired job to one of them, and the lease-token guard makes the
update a no-op if the original scheduler records its outcome first.
"""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncEngine

from app import metrics
from app.db.watch import DB_WATCH
from app.domain.job import AttemptOutcome, FinishedAttempt, RunOutcome
from app.domain.lifecycle import after_attempt
from app.logs import log_event
from app.settings import Settings, copy_settings, default_of
from app.store.idempotency import idempotency_key_purge_expired
from app.store.outcomes import job_finish_attempts
from app.store.rescues import ExpiredLease, job_lock_expired_leases
from app.store.retention import dead_letter_delete_expired, job_delete_finished, run_delete_beyond_kept

logger = logging.getLogger(__name__)

RETENTION_BATCH_PAUSE_S = 0.05


@dataclass(frozen=True)
class ReaperConfig:
    interval_s: float = default_of("reaper_interval_s")
    batch_size: int = default_of("reaper_batch_size")
    retention_days: float = default_of("retention_days")
    dead_letter_retention_days: float | None = default_of("dead_letter_retention_days")
    runs_kept_per_job: int = default_of("runs_kept_per_job")
    retention_batch_size: int = default_of("retention_batch_size")
    # A dead replica's jobs wait its target's timeout plus this (the scheduler's time to
    # record an outcome) after its heartbeat expired: a POST it started may still end.
    lease_margin_s: float = default_of("lease_margin_s")
    dead_replica_fast_rescue: bool = default_of("dead_replica_fast_rescue")

    def __post_init__(self) -> None:
        if self.interval_s <= 0 or self.batch_size < 1 or self.retention_batch_size < 1:
            raise ValueError("interval_s and the batch sizes must be positive")
        if self.retention_days <= 0 or self.runs_kept_per_job < 1:
            raise ValueError("retention_days and runs_kept_per_job must be positive")

    @classmethod
    def from_settings(cls, settings: Settings) -> ReaperConfig:
        return copy_settings(cls, settings, interval_s="reaper_interval_s", batch_size="reaper_batch_size")


class Reaper:
    name = "reaper"

    def __init__(self, engine: AsyncEngine, config: ReaperConfig, rng: random.Random | None = None) -> None:
        self._engine = engine
        self.config = config
        self._rng = rng or random.Random()
        self.wake = asyncio.Event()
        # Where the walk over recurring jobs' surplus runs stands (None: from the start).
        self._runs_cursor: uuid.UUID | None = None

    async def tick(self) -> dict[str, int]:
        return await self.run_once()

    async def run_once(self) -> dict[str, int]:
        counts = {"rescued": 0, "dead_lettered": 0}
        with DB_WATCH.operation("rescue"):
            async with self._engine.begin() as conn:
                expired = await job_lock_expired_leases(
                    conn, self.config.batch_size, self.config.lease_margin_s, self.config.dead_replica_fast_rescue
                )
                items = [
                    FinishedAttempt(
                        lease.job,
                        AttemptOutcome(RunOutcome.LEASE_EXPIRED, error=_rescue_reason(lease)),
                        after_attempt(lease.job.attempt_context(), False, lease.job.claimed_at, self._rng),
                    )
                    for lease in expired
                ]
                owner_dead = {lease.job.lease_token for lease in expired if lease.owner_dead}
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
                owner_dead=item.job.lease_token in owner_dead,
            )
        metrics.leases_reaped(counts["rescued"], counts["dead_lettered"])
        # Housekeeping rides along, after the rescue so it can never hold one up: Idempotency-Keys
        # are kept for 24 hours.
        async with self._engine.begin() as conn:
            counts["idempotency_keys_purged"] = await idempotency_key_purge_expired(conn)
        counts.update(await self.retain())
        return counts

    async def retain(self) -> dict[str, int]:
        """One batch of each retention delete, each in its own short transaction."""
        config, limit = self.config, self.config.retention_batch_size
        counts = {"dead_letters_deleted": 0}
        if config.dead_letter_retention_days is not None:
            async with self._engine.begin() as conn:
                counts["dead_letters_deleted"] = await dead_letter_delete_expired(
                    conn, config.dead_letter_retention_days, limit
                )
        async with self._engine.begin() as conn:
            counts["runs_deleted"], self._runs_cursor = await run_delete_beyond_kept(
                conn, config.runs_kept_per_job, limit, self._runs_cursor
            )
        async with self._engine.begin() as conn:
            counts["jobs_deleted"] = await job_delete_finished(conn, config.retention_days, limit)
        if any(counts.values()):
            log_event(logger, "history_deleted", **counts)
        return counts

    def idle_wait_s(self, counts: dict[str, int]) -> float:
        if counts["rescued"] + counts["dead_lettered"] >= self.config.batch_size:
            return 0.0
        # A full retention batch: more is waiting; the next batch follows after a short
        # pause, so a large first clean-up proceeds steadily without hogging the database.
        if max(counts["jobs_deleted"], counts["runs_deleted"], counts["dead_letters_deleted"]) >= (
            self.config.retention_batch_size
        ):
            return min(self.config.interval_s, RETENTION_BATCH_PAUSE_S)
        return self.config.interval_s


def _rescue_reason(lease: ExpiredLease) -> str:
    if lease.owner_dead:
        return f"replica {lease.job.lease_owner} died before an outcome was recorded"
    return f"lease held by {lease.job.lease_owner} expired before an outcome was recorded"
