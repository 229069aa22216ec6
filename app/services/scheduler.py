"""The scheduler: claims due jobs under a lease, delivers them, records each outcome.

Each replica claims only from the partitions it owns (app/services/ownership.py), fenced in
the claim statement by owner and epoch; SKIP LOCKED keeps claims disjoint even while
ownership moves, and the per-attempt lease token fences a completion whose lease the
reaper rescued meanwhile.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import random
import time
import uuid

from sqlalchemy.ext.asyncio import AsyncEngine

from app import metrics
from app.db.errors import is_transient_db_error
from app.db.watch import DB_WATCH
from app.domain.completion import completion_url, mint_token
from app.domain.fair_share import SlotShares, tenant_share_of
from app.domain.job import ClaimedJob, FinishedAttempt, OpenedAttempt
from app.domain.lifecycle import after_attempt
from app.domain.occurrences import next_after_run, plan_due
from app.domain.states import JobState
from app.keyring import KeyRing
from app.logs import log_event
from app.services.claim_answers import ClaimAnswers
from app.services.delivery_logs import log_lease_fenced, log_outcome
from app.services.dispatcher import Dispatcher, PostNotStarted
from app.services.due_listener import DueListener
from app.services.loop import jittered, run_forever
from app.services.ownership import PartitionOwnership
from app.services.recorder import OutcomeRecorder
from app.services.scheduler_config import SchedulerConfig
from app.services.wake_plan import WakePlan
from app.store.claims import job_claim_batch
from app.store.lease_writes import (
    job_hand_off_occurrence,
    job_release_claim,
    job_settle_due_plan,
)
from app.store.rescues import replica_session_name

logger = logging.getLogger(__name__)

# The least time between two claims that each drained everything due (see tick()).
MIN_CLAIM_GAP_S = 0.005
# The least time between two claims that came back short while some tenant or target was
# at its share (see idle_wait_s()).
HELD_BACK_WAIT_S = 0.025


@dataclasses.dataclass(frozen=True)
class ClaimPass:
    """One scheduler pass: the jobs it asked for and claimed, the deliveries in flight after
    it, and whether some tenant or target was at its share (its jobs skipped)."""

    requested: int
    claimed: int
    in_flight: int
    some_full: bool = False


class Scheduler:
    name = "scheduler"

    def __init__(
        self, engine: AsyncEngine, config: SchedulerConfig, key_ring: KeyRing, rng: random.Random | None = None
    ) -> None:
        self._engine = engine
        self.config = config
        # Opens the claimed jobs' target secrets (the claim's row mapper, app/store/job_rows.py).
        self._key_ring = key_ring
        # The one random source: retry backoff and the loop's jitter.
        self._rng = rng or random.Random()
        self._dispatcher = Dispatcher(config.concurrency, config.max_target_timeout_s, config.egress)
        self._recorder = OutcomeRecorder(engine)
        self.ownership = PartitionOwnership(
            engine, config.replica_id, config.partition_lease_s, config.partition_renew_s
        )
        # Deliveries in flight, with the lease token each holds.
        self._tasks: dict[asyncio.Task[None], uuid.UUID] = {}
        self.claim_answers = ClaimAnswers(engine, config.replica_id, config.lease_s)
        self.wake = asyncio.Event()
        self._started = False
        self._wake_plan = WakePlan(self.wake)
        self._last_claim_mono = float("-inf")
        # Free delivery slots worth a claim while deliveries are in flight.
        self._refill = max(1, min(config.batch_size, config.concurrency) // 2)
        self._last_short = False
        # Per-tenant and per-target shares of the `concurrency` slots (app/domain/fair_share.py).
        self.shares = SlotShares(
            tenant_share_of(config.concurrency, config.tenant_max_share),
            config.target_default_max_in_flight,
            self._refill,
        )

    async def start(self) -> None:
        if not self._started:
            await self._dispatcher.start()
            self._started = True

    async def close(self, grace_s: float | None = None) -> None:
        """Waits for deliveries in flight (up to `grace_s`), then cancels the rest, and hands
        its partitions back so the other replicas take them over at once.

        A cancelled delivery's lease expires and the reaper retries it: nothing is lost.
        """
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=grace_s)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        await self._recorder.drain()
        await self._dispatcher.close()
        self._started = False
        try:
            await self.ownership.release_all()
        except Exception as exc:
            if not is_transient_db_error(exc):
                raise
            # The leases expire on their own; the other replicas take over then.
            log_event(logger, "partitions_release_failed", logging.WARNING, error=type(exc).__name__)

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    async def run_once(self, wait: bool = True) -> ClaimPass:
        """Claims one batch and starts its deliveries; with `wait`, returns when all are recorded.

        Ownership rounds run on their own task (run_forever); a claim waits for one only when
        this replica holds no trusted partitions (first pass, or after a stall)."""
        await self.start()
        self.wake.clear()
        self._wake_plan.forget_next_due()
        if not self.ownership.trusted():
            await self.ownership.run_once()
        if self.claim_answers.lost:
            await self.claim_answers.release_lost(self._tasks.values())
        capacity = self._capacity()
        if capacity < self._refill or capacity <= 0:
            # Nearly full: wait until a good share of the slots is free (`wake`), rather
            # than pay a claim for every delivery that finishes.
            return ClaimPass(requested=0, claimed=0, in_flight=len(self._tasks))
        requested = min(self.config.batch_size, capacity)
        held = self.ownership.held()
        if not held:
            return ClaimPass(requested=requested, claimed=0, in_flight=len(self._tasks))
        with DB_WATCH.operation("claim"):
            try:
                async with self._engine.connect() as conn:
                    # One statement, atomic on its own: no BEGIN and COMMIT round trips (the claim
                    # opens a transaction where it needs one).
                    await conn.execution_options(isolation_level="AUTOCOMMIT")
                    batch = await job_claim_batch(
                        conn,
                        self._key_ring,
                        self.config.replica_id,
                        requested,
                        self.config.lease_s,
                        held,
                        self.config.priority_aging_s,
                        self.shares.claim_shares(),
                    )
            except Exception as exc:
                self.claim_answers.failed(exc)
                raise

        claimed = batch.jobs
        self.claim_answers.answered(batch)
        for job in claimed:
            self.shares.take(job.tenant_id, _default_capped(job))
        if len(claimed) < requested:
            # Drained what is due: wake when the next job falls due.
            self._wake_plan.note_next_due(batch.db_now, batch.next_due_at)
        claimed_mono = time.monotonic()
        self._last_claim_mono = claimed_mono
        started: list[asyncio.Task[None]] = []
        for job in claimed:
            task = asyncio.create_task(self._deliver(job, held[job.partition], claimed_mono))
            self._tasks[task] = job.lease_token
            task.add_done_callback(self._on_task_done)
            started.append(task)
        if wait and started:
            await asyncio.gather(*started)
        return ClaimPass(requested, len(claimed), len(self._tasks), some_full=self.shares.full_count() > 0)

    def idle_wait_s(self, result: ClaimPass) -> float:
        if result.requested and result.claimed >= result.requested:
            if result.some_full:
                # The claim filled a tenant's or target's share: the next one would skip its
                # jobs, and in a one-tenant burst find nothing else (a claim planned afresh,
                # ~15 ms under load, in which no slot could be refilled). Claim again once
                # its slots free up (`wake`), or after HELD_BACK_WAIT_S for the others.
                return HELD_BACK_WAIT_S
            # Everything asked for was due: more probably is, so claim again at once.
            return 0.0
        if result.some_full:
            # Jobs of a tenant or target at its share may be all that is due (the next due
            # time says nothing then), or may hide others' jobs from this claim (the next
            # one skips it). Claim again when its slots free up (`wake`), when a NOTIFY or
            # the next due time says so, but not more often than this.
            return max(HELD_BACK_WAIT_S, self._wake_plan.wait_s(self.config.poll_interval_s))
        # Nearly full, `wake` ends the wait once enough delivery slots are free. Otherwise
        # sleep until the next known due time, at most one poll interval (jobs in partitions
        # taken over, and due times that no notice announced, are found by the poll).
        if not result.requested:
            return self.config.poll_interval_s
        return self._wake_plan.wait_s(self.config.poll_interval_s)

    async def tick(self) -> ClaimPass:
        # Claims that drained everything due are spaced MIN_CLAIM_GAP_S apart, so a steady
        # trickle of due jobs is claimed in small batches instead of one round trip per job.
        gap = self._last_claim_mono + MIN_CLAIM_GAP_S - time.monotonic()
        if self._last_short and gap > 0:
            await asyncio.sleep(gap)
        result = await self.run_once(wait=False)
        self._last_short = result.claimed < result.requested
        return result

    async def run_forever(self, stop: asyncio.Event) -> None:
        # Ownership rounds keep their own rhythm, so a slow claim never delays a renewal and a
        # renewal never delays a claim.
        renewals = asyncio.create_task(run_forever(self.ownership, stop, logger))
        watchdog = asyncio.create_task(self.ownership.watch_loop(stop))
        listener = asyncio.create_task(
            DueListener(self._engine, self._wake_plan.on_due, replica_session_name(self.config.replica_id)).run(stop)
        )
        try:
            await run_forever(self, stop, logger, wait_policy=self)
        finally:
            await renewals
            await watchdog
            await listener
            self._wake_plan.cancel()

    # run_forever's wait policy (app/services/loop.py): a wait ends exactly at the next due
    # time; only a full poll interval is jittered, where it keeps replicas apart (the error
    # backoff is not).

    def sleep_s(self, wait_s: float, failed: bool) -> float:
        if failed or wait_s < self.config.poll_interval_s:
            return wait_s
        return jittered(wait_s, self._rng)

    def sleeping(self, sleep_s: float | None) -> None:
        # A NOTIFY of a job due before the planned wake-up cuts the sleep short (WakePlan.on_due).
        self._wake_plan.planned(sleep_s)

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.pop(task, None)
        if self._capacity() == self._refill:
            self.wake.set()
        if not task.cancelled() and task.exception() is not None:
            log_event(logger, "delivery_task_failed", logging.ERROR, error=repr(task.exception()))

    def _capacity(self) -> int:
        # A delivery holds its slot until its outcome is recorded: more POSTs in flight than
        # `concurrency` would only lengthen the group commit's queue, and the leases' clocks.
        # (Freeing the slot at the answer instead made no difference in a burst:
        # bench/log/2026-11-25-webhook-client.md.)
        return self.config.concurrency - len(self._tasks)

    async def _deliver(self, job: ClaimedJob, epoch: int, claimed_mono: float) -> None:
        try:
            finished = await self._attempt(job, epoch, claimed_mono)
        finally:
            # The tenant's and target's shares free once the POST is answered (or never made).
            if self.shares.give_back(job.tenant_id, _default_capped(job)):
                self.wake.set()
        if finished is None:
            return
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

    async def _attempt(
        self, job: ClaimedJob, epoch: int, claimed_mono: float
    ) -> FinishedAttempt | OpenedAttempt | None:
        """The POST (after the misfire and hand-off steps of a recurring job) and the step it
        leads to (or, for an async delivery answered 202, the attempt left open); None when
        nothing was sent (untrusted lease, nothing due, lease lost)."""
        partition = job.partition
        if not await self._still_trusted(job, partition, epoch, claimed_mono):
            return None
        if job.recurrence is not None and job.attempt == 1:
            settled = await self._settle_misfire(job, claimed_mono)
            if settled is None:
                return None
            job = settled
            if job.recurrence is not None and job.recurrence.hands_off_occurrences:
                child = await self._hand_off(job, claimed_mono)
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
                _db_clock(job, claimed_mono),
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
            _db_clock(job, claimed_mono),
            self._rng,
            retryable=result.retryable,
            retry_after_s=result.retry_after_s,
        )
        return FinishedAttempt(job, result, step)

    async def _still_trusted(self, job: ClaimedJob, partition: int, epoch: int, claimed_mono: float) -> bool:
        """Trust the lease only while it can still outlive the POST, and only while this replica
        still owns the partition it claimed from under the same epoch: after a stall (event loop
        starved, process paused) the reaper or a new owner may already have the job."""
        if self._trust_holds(partition, epoch, claimed_mono):
            return True
        await self._release_untrusted(job)
        return False

    def _trust_holds(self, partition: int, epoch: int, claimed_mono: float) -> bool:
        return time.monotonic() <= claimed_mono + self.config.post_start_window_s and self.ownership.still_holds(
            partition, epoch
        )

    async def _release_untrusted(self, job: ClaimedJob) -> None:
        # No POST was made: hand the job back without counting the attempt.
        async with self._engine.begin() as conn:
            released = await job_release_claim(conn, job)
        log_event(logger, "lease_untrusted_released", logging.WARNING, job_id=str(job.id), released=released)

    async def _hand_off(self, job: ClaimedJob, claimed_mono: float) -> ClaimedJob | None:
        """overlap_policy allow: the occurrence goes to a child job and the parent moves on to
        its next fire time now, so a slow delivery never holds the next one back."""
        assert job.recurrence is not None
        now = _db_clock(job, claimed_mono)
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

    async def _settle_misfire(self, job: ClaimedJob, claimed_mono: float) -> ClaimedJob | None:
        """Applies the job's misfire policy to a late occurrence; returns the job to deliver
        (possibly for another fire time), or None when nothing is to be delivered now."""
        assert job.recurrence is not None
        plan = plan_due(job.recurrence, job.scheduled_for, job.occurrences_run, _db_clock(job, claimed_mono))
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


def _default_capped(job: ClaimedJob) -> uuid.UUID | None:
    """The job's target, when the scheduler's default in-flight cap applies to it."""
    return job.target_id if job.target_max_in_flight is None else None


def _db_clock(job: ClaimedJob, claimed_mono: float) -> dt.datetime:
    """Now on the database's clock: its time at the claim plus local monotonic time since."""
    return job.claimed_at + dt.timedelta(seconds=time.monotonic() - claimed_mono)
