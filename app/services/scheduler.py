"""The scheduler: claims due jobs under a lease and runs their deliveries within its slots
and the tenants' and targets' shares; each claimed job's attempt and its record are
app/services/attempts.py.

Each replica claims only from the partitions it owns (app/services/ownership.py), fenced in
the claim statement by owner and epoch; SKIP LOCKED keeps claims disjoint even while
ownership moves, and the per-attempt lease token fences a completion whose lease the
reaper rescued meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
import uuid

from sqlalchemy.pool import QueuePool

from app.db.async_engine import AsyncEngine
from app.db.errors import is_transient_db_error
from app.db.watch import DB_WATCH
from app.domain.db_clock import DbClock
from app.domain.fair_share import SlotShares, tenant_share_of
from app.domain.job import ClaimedJob
from app.keyring import KeyRing
from app.logs import log_event
from app.services.attempts import AttemptRunner
from app.services.claim_answers import ClaimAnswers
from app.services.due_listener import DueListener
from app.services.loop import jittered, run_forever
from app.services.ownership import PartitionOwnership
from app.services.scheduler_config import SchedulerConfig
from app.services.wake_plan import WakePlan
from app.store.claims import job_claim_batch, job_claim_warm_up
from app.store.outcomes import job_finish_warm_up
from app.store.rescues import replica_session_name

logger = logging.getLogger(__name__)

# The longest the warm-up before the first ownership round may take (warm_up()).
WARM_UP_MAX_S = 5.0
# The sessions warm_up() opens: what a scheduler keeping up uses at once (a claim, the outcomes'
# group commit, an ownership round, a claim handed back). The pool hands out the sessions it
# has in turn and opens more only under more load.
WARM_SESSIONS = 4
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
        self.wake = asyncio.Event()
        # Partitions just taken may hold jobs already due: claim at once.
        self.ownership = PartitionOwnership(
            engine, config.replica_id, config.partition_lease_s, config.partition_renew_s, on_acquired=self.wake.set
        )
        # The database's clock as this process knows it, from its claims' readings: when a
        # claimed job is due here, what an attempt's time is, when to claim again.
        self.clock = DbClock()
        # What happens to each claimed job between its claim and its outcome's record.
        self.attempts = AttemptRunner(engine, config, key_ring, self.ownership, self._rng, self.clock)
        # Deliveries in flight, with the lease token each holds.
        self._tasks: dict[asyncio.Task[None], uuid.UUID] = {}
        self.claim_answers = ClaimAnswers(engine, config.replica_id, config.lease_s, config.claim_ahead_s)
        self._started = False
        self._wake_plan = WakePlan(self.wake, self.clock, config.claim_ahead_s)
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
            await self.attempts.start()
            self._started = True

    async def close(self, grace_s: float | None = None) -> None:
        """Hands its partitions back so the other replicas take them over at once, then waits
        for deliveries in flight (up to `grace_s`) and cancels the rest.

        A cancelled delivery's lease expires and the reaper retries it: nothing is lost.
        """
        try:
            await self.ownership.release_all()
        except Exception as exc:
            if not is_transient_db_error(exc):
                raise
            # The leases expire on their own; the other replicas take over then.
            log_event(logger, "partitions_release_failed", logging.WARNING, error=type(exc).__name__)
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=grace_s)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        await self.attempts.close()
        self._started = False

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
                        self.config.claim_ahead_s,
                    )
            except Exception as exc:
                self.claim_answers.failed(exc)
                raise

        claimed = batch.jobs
        self.claim_answers.answered(batch)
        # Before the jobs start and the next wake is planned: both map due times with it.
        self.clock.observe(batch.received_mono, batch.clock_at)
        for job in claimed:
            self.shares.take(job.tenant_id, _default_capped(job))
        if len(claimed) < requested:
            # Drained what is due: wake when the next job falls due.
            self._wake_plan.note_next_due(batch.next_due_at)
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

    async def warm_up(self) -> None:
        """Before this replica takes any partition: open its HTTP session and WARM_SESSIONS
        database sessions, each with the claim and the outcome batch prepared, so that its first
        claims after joining do not each wait for a new session and the claim's first plan on it
        (measured: 20-120 ms apiece, which made the jobs it took over ~250 ms late), nor its
        first burst for the statements' compilation."""
        await self.start()
        config = self.config
        # At most half of what the pool may hold: the process's other services use it too.
        pool = self._engine.pool
        count = min(WARM_SESSIONS, pool.size() // 2) if isinstance(pool, QueuePool) else WARM_SESSIONS
        try:
            # One session at a time, each kept open until all are (so each is a new one): the
            # plans cost the database CPU the replicas already running need for their claims.
            async with contextlib.AsyncExitStack() as sessions:
                for _ in range(max(1, count)):
                    conn = await sessions.enter_async_context(self._engine.connect())
                    await conn.execution_options(isolation_level="AUTOCOMMIT")
                    await job_claim_warm_up(
                        conn,
                        self._key_ring,
                        config.replica_id,
                        config.batch_size,
                        config.lease_s,
                        config.priority_aging_s,
                    )
                    await job_finish_warm_up(conn)
        except Exception as exc:
            # Only time is lost: the sessions open as the claims need them, and the loops below
            # report an outage (and raise anything else) on their first pass.
            if not is_transient_db_error(exc):
                log_event(logger, "scheduler_warm_up_failed", logging.WARNING, error=type(exc).__name__)

    async def run_forever(self, stop: asyncio.Event) -> None:
        # The warm-up only saves time: a database too slow to finish it soon, or a stop, ends it.
        warming = asyncio.create_task(self.warm_up())
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait({warming, stopping}, timeout=WARM_UP_MAX_S, return_when=asyncio.FIRST_COMPLETED)
        for task in (warming, stopping):
            task.cancel()
        await asyncio.gather(warming, stopping, return_exceptions=True)
        if stop.is_set():
            return
        # Ownership rounds keep their own rhythm, so a slow claim never delays a renewal and a
        # renewal never delays a claim.
        renewals = asyncio.create_task(run_forever(self.ownership, stop, logger))
        watchdog = asyncio.create_task(self.ownership.watch_loop(stop))
        listener = asyncio.create_task(
            DueListener(
                self._engine,
                self._wake_plan.on_due,
                replica_session_name(self.config.replica_id),
                on_partitions=self.ownership.on_notice,
            ).run(stop)
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
            finished = await self.attempts.run(job, epoch, claimed_mono)
        finally:
            # The tenant's and target's shares free once the POST is answered (or never made).
            if self.shares.give_back(job.tenant_id, _default_capped(job)):
                self.wake.set()
        if finished is not None:
            await self.attempts.record(finished, claimed_mono)


def _default_capped(job: ClaimedJob) -> uuid.UUID | None:
    """The job's target, when the scheduler's default in-flight cap applies to it."""
    return job.target_id if job.target_max_in_flight is None else None
