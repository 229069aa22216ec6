"""The reaper: rescues jobs whose lease expired (their scheduler died or stalled mid-delivery),
and those of a replica whose death is certain (heartbeat and partition leases expired) at
once, without waiting out their job lease; then deletes old history (app/store/retention.py).

An open asynchronous attempt whose deadline or heartbeat deadline passed is failed the same
way (outcome async_timeout or heartbeat_timeout); its completion token is fenced from then on.

A rescued lease counts as a failed attempt: the job goes to `retrying` with backoff, or to
the dead-letter queue when its attempts are exhausted. Several reapers may run at once:
SKIP LOCKED gives each expired job to one of them, and the lease-token guard makes the
update a no-op if the original scheduler records its outcome first.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from dataclasses import asdict, dataclass

from app import metrics
from app.db.async_engine import AsyncEngine
from app.db.watch import DB_WATCH
from app.domain.health import HealthDefaults
from app.domain.job import AttemptOutcome, FinishedAttempt, RunOutcome
from app.domain.lifecycle import after_attempt
from app.keyring import KeyRing
from app.logs import log_event
from app.services.check_watch import check_watch_once
from app.services.health_watch import health_watch_once
from app.services.hold_watch import hold_watch_once
from app.settings import Settings, copy_settings, default_of
from app.store.completions import job_apply_requested_pauses, job_count_open_async
from app.store.idempotency import idempotency_key_purge_expired
from app.store.outcomes import job_finish_attempts
from app.store.rescues import ExpiredLease, job_lock_expired_leases
from app.store.retention import dead_letter_delete_expired, job_delete_finished, run_delete_beyond_kept

logger = logging.getLogger(__name__)

RETENTION_BATCH_PAUSE_S = 0.05
# The shortest time between two watches over schedules (health, check-ins, held occurrences).
WATCH_INTERVAL_S = 1.0


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
    # Watching over schedules (health, check-ins, held occurrences): the defaults of health.
    expect_max_consecutive_failures: int = default_of("expect_max_consecutive_failures")
    expect_success_within_s: int | None = default_of("expect_success_within_s")
    check_pings_kept: int = default_of("check_pings_kept")

    def __post_init__(self) -> None:
        if self.interval_s <= 0 or self.batch_size < 1 or self.retention_batch_size < 1:
            raise ValueError("interval_s and the batch sizes must be positive")
        if self.retention_days <= 0 or self.runs_kept_per_job < 1:
            raise ValueError("retention_days and runs_kept_per_job must be positive")

    @classmethod
    def from_settings(cls, settings: Settings) -> ReaperConfig:
        return copy_settings(cls, settings, interval_s="reaper_interval_s", batch_size="reaper_batch_size")


@dataclass(frozen=True)
class RetentionPass:
    """Rows one retention pass deleted (a batch of each kind at most)."""

    dead_letters_deleted: int
    runs_deleted: int
    jobs_deleted: int


@dataclass(frozen=True)
class WatchPass:
    """What one pass of watching over schedules did: health edges reported (failing or
    recovered), checks gone down, occurrences of paused targets held or released."""

    health_events: int = 0
    checks_down: int = 0
    held: int = 0


@dataclass(frozen=True)
class ReaperPass:
    """One reaper pass: leases rescued (back to retrying, or to the dead-letter queue), then
    the housekeeping that rode along."""

    rescued: int
    dead_lettered: int
    idempotency_keys_purged: int
    retention: RetentionPass
    watch: WatchPass = WatchPass()


class Reaper:
    name = "reaper"

    def __init__(
        self, engine: AsyncEngine, config: ReaperConfig, key_ring: KeyRing, rng: random.Random | None = None
    ) -> None:
        self._engine = engine
        self.config = config
        # The rescue reads jobs as the claim does, target secrets opened (app/store/job_rows.py).
        self._key_ring = key_ring
        self._rng = rng or random.Random()
        self.wake = asyncio.Event()
        # Where the walk over recurring jobs' surplus runs stands (None: from the start).
        self._runs_cursor: uuid.UUID | None = None
        # When the last watch began (monotonic); None: never.
        self._watched_at: float | None = None

    async def tick(self) -> ReaperPass:
        return await self.run_once()

    async def run_once(self) -> ReaperPass:
        rescued = dead_lettered = 0
        with DB_WATCH.operation("rescue"):
            async with self._engine.begin() as conn:
                expired = await job_lock_expired_leases(
                    conn,
                    self._key_ring,
                    self.config.batch_size,
                    self.config.lease_margin_s,
                    self.config.dead_replica_fast_rescue,
                )
                items = [
                    FinishedAttempt(
                        lease.job,
                        _rescue_outcome(lease),
                        after_attempt(lease.job.attempt_context(), False, lease.job.claimed_at, self._rng),
                    )
                    for lease in expired
                ]
                owner_dead = {lease.job.lease_token for lease in expired if lease.owner_dead}
                # We hold the rows' locks, so every one applies; the guard stays as a backstop.
                applied = await job_finish_attempts(conn, items)
                # A pause asked for while an async attempt was open takes effect now.
                await job_apply_requested_pauses(conn, [lease.job.id for lease in expired if lease.async_open])
        for item in items:
            if item.lease not in applied:
                continue
            if item.step.dead_letter:
                dead_lettered += 1
            else:
                rescued += 1
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
        metrics.leases_reaped(rescued, dead_lettered)
        timed_out = [item.result.outcome for item in items if item.lease in applied]
        metrics.async_timeouts(timed_out.count(RunOutcome.ASYNC_TIMEOUT), timed_out.count(RunOutcome.HEARTBEAT_TIMEOUT))
        async with self._engine.connect() as conn:
            metrics.ASYNC_OPEN.set(await job_count_open_async(conn))
        # Housekeeping rides along, after the rescue so it can never hold one up: Idempotency-Keys
        # are kept for 24 hours.
        async with self._engine.begin() as conn:
            purged = await idempotency_key_purge_expired(conn)
        watched = WatchPass()
        now = time.monotonic()
        # The watch is a few statements (~10-50 ms): at most once a WATCH_INTERVAL_S, however
        # short the reaper's own interval (its rescue pass may run every 50 ms).
        if self._watched_at is None or now - self._watched_at >= WATCH_INTERVAL_S:
            self._watched_at = now
            watched = await self.watch()
        return ReaperPass(rescued, dead_lettered, purged, await self.retain(), watched)

    async def watch(self) -> WatchPass:
        """Health edges, overdue check-ins and held occurrences: each its own short work."""
        config = self.config
        defaults = HealthDefaults(config.expect_max_consecutive_failures, config.expect_success_within_s)
        return WatchPass(
            health_events=await health_watch_once(self._engine, defaults, config.batch_size),
            checks_down=await check_watch_once(self._engine, config.batch_size, config.check_pings_kept),
            held=await hold_watch_once(self._engine, config.batch_size),
        )

    async def retain(self) -> RetentionPass:
        """One batch of each retention delete, each in its own short transaction."""
        config, limit = self.config, self.config.retention_batch_size
        dead_letters = 0
        if config.dead_letter_retention_days is not None:
            async with self._engine.begin() as conn:
                dead_letters = await dead_letter_delete_expired(conn, config.dead_letter_retention_days, limit)
        async with self._engine.begin() as conn:
            runs, self._runs_cursor = await run_delete_beyond_kept(
                conn, config.runs_kept_per_job, limit, self._runs_cursor
            )
        async with self._engine.begin() as conn:
            jobs = await job_delete_finished(conn, config.retention_days, limit)
        retained = RetentionPass(dead_letters, runs, jobs)
        if dead_letters or runs or jobs:
            log_event(logger, "history_deleted", **asdict(retained))
        return retained

    def idle_wait_s(self, result: ReaperPass) -> float:
        if result.rescued + result.dead_lettered >= self.config.batch_size:
            return 0.0
        # A full retention batch: more is waiting; the next batch follows after a short
        # pause, so a large first clean-up proceeds steadily without hogging the database.
        retained = result.retention
        if max(retained.jobs_deleted, retained.runs_deleted, retained.dead_letters_deleted) >= (
            self.config.retention_batch_size
        ):
            return min(self.config.interval_s, RETENTION_BATCH_PAUSE_S)
        return self.config.interval_s


def _rescue_outcome(lease: ExpiredLease) -> AttemptOutcome:
    if not lease.async_open:
        return AttemptOutcome(RunOutcome.LEASE_EXPIRED, error=_rescue_reason(lease))
    job = lease.job
    started = lease.awaiting_since
    duration_ms = None if started is None else int((job.claimed_at - started).total_seconds() * 1000)
    if lease.async_deadline_passed:
        outcome = RunOutcome.ASYNC_TIMEOUT
        error = f"no completion reported within async_timeout_s ({job.completion.async_timeout_s} s)"
    else:
        outcome = RunOutcome.HEARTBEAT_TIMEOUT
        error = f"no heartbeat or completion within heartbeat_timeout_s ({job.completion.heartbeat_timeout_s} s)"
    return AttemptOutcome(outcome, status_code=202, error=error, duration_ms=duration_ms, started_at=started)


def _rescue_reason(lease: ExpiredLease) -> str:
    if lease.owner_dead:
        return f"replica {lease.job.lease_owner} died before an outcome was recorded"
    return f"lease held by {lease.job.lease_owner} expired before an outcome was recorded"
