"""One claimed job's attempt, for the scheduler (app/services/scheduler.py): the trust checks
before the POST, a recurring job's misfire and hand-off steps, the POST itself (with a
completion URL for an async target), the step it leads to, and its recording (group commit,
app/services/recorder.py) with the logs and metrics that follow.

The scheduler owns the claim loop and the delivery slots; this owns what happens to one job
between its claim and its outcome's record.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time

from app import metrics
from app.db.async_engine import AsyncEngine
from app.domain.completion import completion_url, mint_token
from app.domain.db_clock import DbClock, db_now, until_s
from app.domain.job import ClaimedJob, FinishedAttempt, OpenedAttempt
from app.domain.lifecycle import after_attempt
from app.domain.occurrences import due_delay, next_after_run, plan_due
from app.domain.schedule import jitter_delay
from app.domain.states import JobState
from app.keyring import KeyRing
from app.logs import log_event
from app.services.delivery_logs import log_lease_fenced, log_outcome
from app.services.dispatcher import Dispatcher, PostNotStarted
from app.services.ownership import PartitionOwnership
from app.services.recorder import OutcomeRecorder
from app.services.scheduler_config import SchedulerConfig
from app.store.lease_writes import job_hand_off_occurrence, job_release_claim, job_settle_due_plan

logger = logging.getLogger("app.services.scheduler")


class AttemptRunner:
    def __init__(
        self,
        engine: AsyncEngine,
        config: SchedulerConfig,
        key_ring: KeyRing,
        ownership: PartitionOwnership,
        rng: random.Random,
        clock: DbClock,
    ) -> None:
        self._engine = engine
        self.config = config
        # Mints async deliveries' completion tokens (app/domain/completion.py).
        self._key_ring = key_ring
        self._ownership = ownership
        self._rng = rng
        self._dispatcher = Dispatcher(config.concurrency, config.max_target_timeout_s, config.egress)
        # The database's clock as this process knows it (the scheduler feeds it each claim's
        # reading): when a job is due here, what an attempt's time is.
        self._clock = clock
        self._recorder = OutcomeRecorder(engine)

    async def start(self) -> None:
        await self._dispatcher.start()

    async def close(self) -> None:
        """Waits for outcomes already handed over to be written, then closes the HTTP client."""
        await self._recorder.drain()
        await self._dispatcher.close()

    async def record(self, finished: FinishedAttempt | OpenedAttempt, claimed_mono: float) -> None:
        """Records an attempt's outcome (or an async delivery's 202) under its lease."""
        if isinstance(finished, OpenedAttempt):
            await self._record_opened(finished, claimed_mono)
            return
        job, result, step = finished.job, finished.result, finished.step
        applied = await self._recorder.record(finished, claimed_mono + self.config.lease_s)
        metrics.delivery_recorded(
            job, result, retrying=step.state == JobState.RETRYING, dead_letter=step.dead_letter, fenced=not applied
        )
        if not applied:
            log_lease_fenced(job, result.outcome)
            return
        if step.schedule_ended:
            log_event(logger, "schedule_ended", job_id=str(job.id), state=step.state.value, reason=step.ended_reason)
        log_outcome(job, result, step.state.value, step.dead_letter)

    async def _record_opened(self, opened: OpenedAttempt, claimed_mono: float) -> None:
        """A 202 of an async delivery: the attempt stays open, its slot is free already."""
        applied = await self._recorder.record(opened, claimed_mono + self.config.lease_s)
        metrics.async_attempt_opened(opened.job, opened.result, fenced=not applied)
        if not applied:
            # Reported on before the 202 was recorded (or fenced): nothing to keep open.
            log_event(logger, "async_open_superseded", job_id=str(opened.job.id), attempt=opened.job.attempt)
            return
        log_event(
            logger,
            "async_attempt_opened",
            job_id=str(opened.job.id),
            attempt=opened.job.attempt,
            async_timeout_s=opened.job.completion.async_timeout_s,
        )

    async def run(self, job: ClaimedJob, epoch: int, claimed_mono: float) -> FinishedAttempt | OpenedAttempt | None:
        """The POST (after the misfire and hand-off steps of a recurring job) and the step it
        leads to (or, for an async delivery answered 202, the attempt left open); None when
        nothing was sent (untrusted lease, nothing due, lease lost)."""
        offset_s = self._offset_s(job, claimed_mono)
        # Claimed a little ahead (SchedulerConfig.claim_ahead_s): nothing happens before its
        # due time, on the database's clock. Checked again after each sleep: the event loop's
        # timers may fire up to a millisecond before the time asked for.
        due_at = job.due_at
        early_s = 0.0 if due_at is None else until_s(due_at, offset_s, time.monotonic())
        while due_at is not None and early_s > 0:
            await asyncio.sleep(early_s)
            early_s = until_s(due_at, offset_s, time.monotonic())
        partition = job.partition
        if not await self._still_trusted(job, partition, epoch, claimed_mono):
            return None
        if job.recurrence is not None and job.attempt == 1:
            settled = await self._settle_misfire(job, offset_s)
            if settled is None:
                return None
            job = settled
            if job.recurrence is not None and job.recurrence.hands_off_occurrences:
                child = await self._hand_off(job, offset_s)
                if child is None:
                    return None
                job = child
            # Those steps took time of their own: check again before the POST.
            if not await self._still_trusted(job, partition, epoch, claimed_mono):
                return None
        token = None
        if job.completion.is_async:
            token = mint_token(self._key_ring.mac_keys[0], job.id, job.lease_token)
        try:
            result = await self._dispatcher.deliver(
                job,
                db_now(offset_s, time.monotonic()),
                lambda: self._trust_holds(partition, epoch, claimed_mono),
                None if token is None else completion_url(self.config.completion_base_url, token),
            )
        except PostNotStarted:
            await self._release_untrusted(job)
            return None
        if token is not None and result.status_code == 202:
            return OpenedAttempt(job, result, token.digest)
        step = after_attempt(
            job.attempt_context(),
            result.succeeded,
            db_now(offset_s, time.monotonic()),
            self._rng,
            retryable=result.retryable,
            retry_after_s=result.retry_after_s,
        )
        return FinishedAttempt(job, result, step)

    def _offset_s(self, job: ClaimedJob, claimed_mono: float) -> float:
        """The database clock's offset for this attempt: the process's (DbClock, fed by the
        claim before its jobs start), else this job's own claim's bound."""
        offset_s = self._clock.offset_s()
        return claimed_mono - job.clock_at.timestamp() if offset_s is None else offset_s

    async def _still_trusted(self, job: ClaimedJob, partition: int, epoch: int, claimed_mono: float) -> bool:
        """Trust the lease only while it can still outlive the POST, and only while this replica
        still owns the partition it claimed from under the same epoch: after a stall (event loop
        starved, process paused) the reaper or a new owner may already have the job."""
        if self._trust_holds(partition, epoch, claimed_mono):
            return True
        await self._release_untrusted(job)
        return False

    def _trust_holds(self, partition: int, epoch: int, claimed_mono: float) -> bool:
        return time.monotonic() <= claimed_mono + self.config.post_start_window_s and self._ownership.still_holds(
            partition, epoch
        )

    async def _release_untrusted(self, job: ClaimedJob) -> None:
        # No POST was made: hand the job back without counting the attempt.
        async with self._engine.begin() as conn:
            released = await job_release_claim(conn, job)
        # Expected on a clean shutdown (the partitions were handed back first); a warning otherwise.
        level = logging.INFO if self._ownership.leaving else logging.WARNING
        log_event(logger, "lease_untrusted_released", level, job_id=str(job.id), released=released)

    async def _hand_off(self, job: ClaimedJob, offset_s: float) -> ClaimedJob | None:
        """overlap_policy allow: the occurrence goes to a child job and the parent moves on to
        its next fire time now, so a slow delivery never holds the next one back."""
        assert job.recurrence is not None
        now = db_now(offset_s, time.monotonic())
        following = next_after_run(
            job.recurrence, job.scheduled_for, now, job.occurrences_run + 1, claimed_at=job.occurrence_claimed_at
        )
        next_at, ended = following.next_at, following.ended
        async with self._engine.begin() as conn:
            child = await job_hand_off_occurrence(conn, job, next_at, ended)
        if child is None:
            log_lease_fenced(job, None)
        elif ended is not None:
            log_event(logger, "schedule_ended", job_id=str(job.id), state="succeeded", reason=ended)
        return child

    async def _settle_misfire(self, job: ClaimedJob, offset_s: float) -> ClaimedJob | None:
        """Applies the job's misfire policy to a late occurrence; returns the job to deliver
        (possibly for another fire time), or None when nothing is to be delivered now."""
        assert job.recurrence is not None
        rec = job.recurrence
        now = db_now(offset_s, time.monotonic())
        # A jittered occurrence is late only past its own fire time's grace; one a resume
        # released from a hold, only past the grace from its release.
        jitter = jitter_delay(job.id, job.scheduled_for, rec.jitter_s)
        plan = plan_due(
            rec, job.scheduled_for, job.occurrences_run, now, due_delay(job.scheduled_for, job.due_at, jitter)
        )
        if plan.deliver_at == job.scheduled_for:
            return job
        async with self._engine.begin() as conn:
            applied = await job_settle_due_plan(conn, job, plan.missed, plan.deliver_at, plan.next_at, plan.ended)
        log_event(
            logger,
            "occurrences_missed" if plan.missed.total else "schedule_ended",
            job_id=str(job.id),
            missed=plan.missed.total,
            deliver_at=plan.deliver_at,
            next_at=plan.next_at,
            ended=plan.ended,
            applied=applied,
        )
        if not applied or plan.deliver_at is None:
            return None
        return dataclasses.replace(job, scheduled_for=plan.deliver_at)
