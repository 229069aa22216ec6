"""The database's health, followed by every process: a commit probe (readiness) and the
stall reporter (warnings and the oldest-operation gauge), both small services run by
app/services/startup.py.

- `CommitProbe` commits a tiny transaction every half stall period; readiness fails when none
  has completed for three periods (app/db/watch.py). In the API it also reads whether any
  scheduler of the cluster is alive.
- `StallReporter` looks at the operations in flight once a second. One older than
  CRONHOOK_DB_STALL_WARN_S is logged (`database_stalled`: which operation, how long, and what
  the server says this process's sessions wait for, read on a connection of its own with a
  deadline), again at doubling ages while it lasts, and `database_stall_cleared` once when
  it ends.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from app import metrics
from app.db.async_engine import AsyncEngine, create_async_engine
from app.db.watch import DbWatch
from app.logs import log_event
from app.store.db_health import database_commit_probe, partition_ownership, schedulers_live, session_waits

logger = logging.getLogger(__name__)

_INSUFFICIENT_PRIVILEGE = "42501"
# The waits look-up may itself hang on a sick server: it gives up after this.
WAITS_DEADLINE_S = 2.0
REPORT_INTERVAL_S = 1.0
# While `cronhook up` waits for its schedulers to take every partition, the probe looks this
# often, so /readyz turns ready within this long of it (a round of ownership is ~1 s).
AWAIT_PARTITIONS_POLL_S = 0.1


@dataclass(frozen=True)
class ProbePass:
    """One commit probe that committed; `weak`: with the fallback commit, which does not
    wait for a synchronous standby."""

    weak: bool


@dataclass(frozen=True)
class StallCheck:
    """One look at the operations in flight: whether one is older than the warning age."""

    stalled: bool


class CommitProbe:
    name = "commit_probe"

    def __init__(
        self, engine: AsyncEngine, watch: DbWatch, warn_s: float, read_cluster: bool, await_schedulers: int = 0
    ) -> None:
        self._engine = engine
        self._watch = watch
        self._warn_s = warn_s
        self._read_cluster = read_cluster
        # `cronhook up`: its schedulers, until the partitions settled among them once
        # (app/db/watch.py, readiness); 0 once they have, or when not waited for.
        self._awaiting = await_schedulers
        if await_schedulers:
            watch.starting = "the schedulers are starting"
        self.wake = asyncio.Event()
        self._weak = False

    async def tick(self) -> ProbePass:
        return await self.run_once()

    async def run_once(self) -> ProbePass:
        with self._watch.operation("commit_probe"):
            async with self._engine.connect() as conn:
                await conn.execution_options(isolation_level="AUTOCOMMIT")
                try:
                    await database_commit_probe(conn, weak=self._weak)
                except DBAPIError as exc:
                    if self._weak or getattr(exc.orig, "sqlstate", None) != _INSUFFICIENT_PRIVILEGE:
                        raise
                    self._weak = True
                    log_event(
                        logger,
                        "commit_probe_weakened",
                        logging.WARNING,
                        detail="EXECUTE on pg_logical_emit_message is not granted to this role: the probe "
                        "falls back to a commit that does not wait for a synchronous standby",
                    )
                    await database_commit_probe(conn, weak=True)
                self._watch.committed()
                if self._read_cluster:
                    self._watch.schedulers_live = await schedulers_live(conn)
                if self._awaiting:
                    self._watch.starting = (await partition_ownership(conn)).settling(self._awaiting)
                    self._awaiting = self._awaiting if self._watch.starting else 0
        return ProbePass(weak=self._weak)

    def idle_wait_s(self, result: ProbePass) -> float:
        if self._awaiting:
            return min(self._warn_s / 2, AWAIT_PARTITIONS_POLL_S)
        return self._warn_s / 2


class StallReporter:
    name = "stall_reporter"

    def __init__(self, engine: AsyncEngine, watch: DbWatch, warn_s: float, session_name: str) -> None:
        self._engine = engine
        self._watch = watch
        self._warn_s = warn_s
        self._session_name = session_name
        self.wake = asyncio.Event()
        self._since: float | None = None
        self._next_report_s = warn_s
        self._worst: str | None = None
        # Its own connections (none pooled): the pool may be held by the stalled operations.
        self._side: AsyncEngine | None = None

    async def tick(self) -> StallCheck:
        return await self.run_once()

    async def run_once(self, now: float | None = None) -> StallCheck:
        now = time.monotonic() if now is None else now
        oldest = self._watch.oldest(now)
        age = oldest.age_s if oldest is not None else 0.0
        metrics.db_oldest_operation(self._watch.role, age)
        if oldest is not None and age >= self._warn_s:
            if self._since is None:
                self._since, self._next_report_s = now - age, self._warn_s
            if age >= self._next_report_s:
                self._worst = oldest.name
                log_event(
                    logger,
                    "database_stalled",
                    logging.WARNING,
                    role=self._watch.role,
                    operation=oldest.name,
                    waited_s=round(age, 1),
                    waits=await self._waits(),
                    detail="a database operation has not returned; deliveries wait for it",
                )
                self._next_report_s = age * 2
            return StallCheck(stalled=True)
        if self._since is not None:
            log_event(
                logger,
                "database_stall_cleared",
                role=self._watch.role,
                operation=self._worst,
                lasted_s=round(now - self._since, 1),
            )
            self._since, self._worst = None, None
        return StallCheck(stalled=False)

    async def _waits(self) -> list[str] | str:
        try:
            async with asyncio.timeout(WAITS_DEADLINE_S):
                async with self._side_engine().connect() as conn:
                    rows = await session_waits(conn, self._session_name)
        except Exception as exc:  # a sick server: the warning goes out without it
            return f"unknown ({type(exc).__name__})"
        return [_describe(row) for row in rows]

    def _side_engine(self) -> AsyncEngine:
        if self._side is None:
            self._side = create_async_engine(
                self._engine.url,
                poolclass=NullPool,
                connect_args={"timeout": WAITS_DEADLINE_S, "server_settings": {"application_name": "cronhook-watch"}},
            )
        return self._side

    def idle_wait_s(self, result: StallCheck) -> float:
        return REPORT_INTERVAL_S


def _describe(row: dict[str, Any]) -> str:
    kind, event = row.get("wait_event_type"), row.get("wait_event")
    waiting = f"{kind}:{event}" if kind else "running (no wait event)"
    return f"{waiting} for {row.get('running_s') or 0:.1f} s"
