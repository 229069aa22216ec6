"""Partition ownership for one scheduler replica: heartbeat, fair share, acquire, renew, shed.

Each round (every `renew_s`) runs one transaction: heartbeat in `replicas`, compute this
replica's fair share of the live replicas, renew what it holds, release any surplus (a
replica joined) or acquire free and expired partitions (a replica left or died). Shares
differ by at most one once membership is stable.

Hand-over: a replica that joins short of its share, releases surplus, or leaves (clean
shutdown) says so on a NOTIFY channel (app/store/partitions.py) in the same transaction; the
others LISTEN (app/services/due_listener.py) and run a round at once, so partitions change
hands within milliseconds: a joiner's first round announces it, the holders release their
surplus and announce that, the joiner takes it; a leaver's partitions are taken as soon as it
has handed them back. The rounds every `renew_s` stay the safety net for lost notices; a crashed
replica's partitions are taken when its leases expire.

Trust: a round that succeeded at local monotonic time t proves the leases valid until at
least t + lease_s on the database's clock (its `now()` is later than t). The replica trusts
its partitions only until t + lease_s - renew_s, on its own monotonic clock, so a replica
that cannot renew (stalled, partitioned from the database) stops claiming and starts no
new POSTs before anyone else can take its partitions over.

Stalls: a lag watchdog (`watch_loop`) beats every fraction of a second. A gap between beats
longer than `stall_s` (half the partition lease; measured on CLOCK_BOOTTIME where the
platform has it, which also counts a suspended machine or VM) means this process was paused or
its event loop starved: whatever it believed about its leases is suspect, so it trusts
nothing until a round that started after the stall has renewed its leases in the database.
`trusted()` checks the gap itself, so the first code to run after a wake-up (a delivery's
last trust check, app/services/dispatcher.py) already sees the stall.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from app.db.async_engine import AsyncEngine
from app.db.watch import DB_WATCH
from app.domain.partition import PARTITION_COUNT, fair_share
from app.logs import log_event
from app.settings import MIN_RENEWALS_PER_PARTITION_LEASE, partition_lease_survives_renewals
from app.store.partitions import (
    Held,
    PartitionEvent,
    partition_acquire,
    partition_notice_sender,
    partition_release,
    partition_renew,
    partitions_announce,
    replica_heartbeat,
    replica_remove,
)

logger = logging.getLogger(__name__)

# A stall longer than this share of the partition lease voids trust until a fresh round.
STALL_FRACTION_OF_LEASE = 0.5
# How often the watchdog beats, as a share of the stall threshold.
BEATS_PER_STALL = 10


def _clock() -> float:
    """Monotonic time that keeps counting while the machine or VM is suspended (Linux)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


if not hasattr(time, "CLOCK_BOOTTIME"):
    _clock = time.monotonic


@dataclass(frozen=True)
class OwnershipRound:
    """One ownership round: the partitions held after it, this replica's fair share, and
    how many it acquired and released."""

    held: int
    target: int
    acquired: int
    released: int


class PartitionOwnership:
    name = "ownership"

    def __init__(
        self,
        engine: AsyncEngine,
        replica_id: str,
        lease_s: float,
        renew_s: float,
        on_acquired: Callable[[], None] | None = None,
    ) -> None:
        """`on_acquired`: called after a round that took partitions (the scheduler claims at
        once: jobs may already be due in them)."""
        if not partition_lease_survives_renewals(lease_s, renew_s):
            raise ValueError(f"partition lease_s must be at least {MIN_RENEWALS_PER_PARTITION_LEASE} x renew_s")
        self._engine = engine
        self.replica_id = replica_id
        self.lease_s = lease_s
        self.renew_s = renew_s
        self._held: Held = {}
        self._trusted_until = 0.0
        self._last_round = float("-inf")
        self._lock = asyncio.Lock()
        self.stall_s = lease_s * STALL_FRACTION_OF_LEASE
        self._last_beat = _clock()
        # Monotonic time of the latest stall noticed: only a round started after it is trusted.
        self._stalled_at = float("-inf")
        self._watching = False  # lag is measured only while watch_loop runs
        self._untrust_logged = False
        self._on_acquired = on_acquired
        # The live replicas of the last round that announced this one short of its share.
        self._short_among: list[str] | None = None
        # Set by release_all: the partitions are being handed back on a clean shutdown.
        self.leaving = False
        # Cuts the wait for the next round short: another replica's notice (on_notice).
        self.wake = asyncio.Event()

    def trusted(self) -> bool:
        now = time.monotonic()
        if self._watching and _clock() - self._last_beat > self.stall_s:
            self._note_stall(now)
        return now < self._trusted_until

    def _note_stall(self, now: float) -> None:
        gap = _clock() - self._last_beat
        self._last_beat = _clock()
        self._stalled_at = now
        if self._trusted_until > 0:
            log_event(logger, "event_loop_stalled", logging.WARNING, gap_s=round(gap, 3), held=len(self._held))
        self._trusted_until = 0.0

    async def watch_loop(self, stop: asyncio.Event) -> None:
        """The lag watchdog: beats until `stop`; a late beat voids trust (see trusted())."""
        beat_s = self.stall_s / BEATS_PER_STALL
        self._last_beat = _clock()
        self._watching = True
        try:
            while not stop.is_set():
                self.trusted()
                self._last_beat = _clock()
                try:
                    await asyncio.wait_for(stop.wait(), beat_s)
                except TimeoutError:
                    pass
        finally:
            self._watching = False

    def held(self) -> Held:
        """The partitions (with epochs) this replica may claim from now; empty once untrusted."""
        return dict(self._held) if self.trusted() else {}

    def still_holds(self, partition: int, epoch: int) -> bool:
        return self.trusted() and self._held.get(partition) == epoch

    def round_due(self) -> bool:
        return time.monotonic() >= self._last_round + self.renew_s or not self.trusted()

    async def tick(self) -> OwnershipRound:
        self.wake.clear()
        return await self.run_once()

    def on_notice(self, payload: str | None) -> None:
        """A PARTITIONS_CHANNEL notice (None: some may have been missed): run a round now,
        unless this replica sent it."""
        if payload is None or partition_notice_sender(payload) != self.replica_id:
            self.wake.set()

    def idle_wait_s(self, result: OwnershipRound) -> float:
        # Short of a fair share (a replica left, or this one just started): look again soon.
        return self.renew_s / 2 if result.held < result.target else self.renew_s

    async def ensure_fresh(self) -> None:
        if self.round_due():
            await self.run_once()

    async def run_once(self) -> OwnershipRound:
        async with self._lock:
            started = time.monotonic()
            # Even leases we stopped trusting are offered for renewal: the statement renews
            # only rows that still name us with the same epoch and have not expired, which
            # nobody else can have taken. Claiming waits for this round to succeed.
            previous = dict(self._held)
            if previous and not self.trusted() and not self._untrust_logged:
                # Once per episode: during a database outage every round lands here.
                self._untrust_logged = True
                log_event(logger, "partitions_untrusted", logging.WARNING, count=len(previous))
            with DB_WATCH.operation("ownership_round"):
                async with self._engine.begin() as conn:
                    live = await replica_heartbeat(conn, self.replica_id, self.lease_s)
                    target = fair_share(self.replica_id, live, PARTITION_COUNT)
                    held = await partition_renew(conn, self.replica_id, previous, self.lease_s)
                    released: list[int] = []
                    acquired: Held = {}
                    if len(held) > target:
                        # Shed the highest-numbered surplus; the joiner acquires it on its next round.
                        surplus = dict(sorted(held.items())[target:])
                        released = await partition_release(conn, self.replica_id, surplus)
                        for partition in released:
                            held.pop(partition, None)
                        if released:
                            await partitions_announce(conn, self.replica_id, PartitionEvent.RELEASED)
                    elif len(held) < target:
                        acquired = await partition_acquire(conn, self.replica_id, target - len(held), self.lease_s)
                        held.update(acquired)
                    # Short of its share among replicas it has not told yet (it just started, or
                    # membership changed): the others hold the rest and release it when told.
                    short = len(held) < target
                    if short and self._short_among != live:
                        await partitions_announce(conn, self.replica_id, PartitionEvent.JOINED)
            self._short_among = live if short else None
            lost = sorted(set(previous) - set(held) - set(released))
            self._held = held
            # A round that began before a stall proves nothing about the time after it.
            self._trusted_until = started + self.lease_s - self.renew_s if started > self._stalled_at else 0.0
            self._untrust_logged = False
            self._last_round = started
        if lost:
            log_event(logger, "partitions_lost", logging.WARNING, partitions=lost)
        if acquired and self._on_acquired is not None:
            self._on_acquired()
        if acquired or released:
            log_event(
                logger,
                "partitions_rebalanced",
                acquired=len(acquired),
                released=len(released),
                held=len(held),
                target=target,
                live_replicas=len(live),
            )
        return OwnershipRound(held=len(held), target=target, acquired=len(acquired), released=len(released))

    async def release_all(self) -> None:
        """On clean shutdown: hand every partition back at once instead of letting leases expire,
        and tell the other replicas to take them now. Deliveries in flight go on under their job
        leases; those that have not started their POST hand their jobs back (attempts.py)."""
        async with self._lock:
            self.leaving = True
            held, self._held, self._trusted_until = self._held, {}, 0.0
            async with self._engine.begin() as conn:
                released = await partition_release(conn, self.replica_id, held)
                await replica_remove(conn, self.replica_id)
                await partitions_announce(conn, self.replica_id, PartitionEvent.LEFT)
        log_event(logger, "partitions_released", count=len(released))
