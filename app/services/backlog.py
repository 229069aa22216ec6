"""Samples this replica's due backlog into the metrics every few seconds: how many due jobs
wait in the partitions it owns, how old the oldest is, and how many a target's limits hold
back on purpose (counted apart, so a rate-limited target does not look like a stuck replica)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

from app.db.async_engine import AsyncEngine
from app.metrics import backlog_observed
from app.store.backlog import job_backlog_of_partitions

DEFAULT_INTERVAL_S = 5.0


class HeldPartitions(Protocol):
    replica_id: str

    def held(self) -> dict[int, int]: ...


@dataclass(frozen=True)
class BacklogSample:
    """One sample: the partitions this replica owns, the due jobs waiting in them, and how
    many of those a target's limits hold back."""

    partitions: int
    due: int
    held_back: int


class BacklogSampler:
    name = "backlog"

    def __init__(self, engine: AsyncEngine, ownership: HeldPartitions, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self._engine = engine
        self._ownership = ownership
        self.interval_s = interval_s
        self.wake = asyncio.Event()

    async def run_once(self) -> BacklogSample:
        partitions = sorted(self._ownership.held())
        async with self._engine.connect() as conn:
            backlog = await job_backlog_of_partitions(conn, partitions)
        backlog_observed(
            self._ownership.replica_id, len(partitions), backlog.due, backlog.oldest_due_at, backlog.held_back,
            backlog.now,
        )  # fmt: skip
        return BacklogSample(len(partitions), backlog.due, backlog.held_back)

    async def tick(self) -> BacklogSample:
        return await self.run_once()

    def idle_wait_s(self, result: BacklogSample) -> float:
        # Until the replica holds partitions (start-up, a takeover), look again soon.
        return self.interval_s if result.partitions else min(1.0, self.interval_s)
