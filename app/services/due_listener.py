"""LISTEN for jobs that became due soon (the triggers on jobs, migrations 0007, 0024 and
0025) and hand each notice's due time to a callback: the scheduler's early wake-up. On the same
connection, the replicas' partition notices (app/store/partitions.py) for the ownership
rounds' early wake-up.

One dedicated connection per scheduler process, outside the pool (a LISTEN holds its
session). When it drops (database restart, network), the listener reconnects with backoff
and reports `None` once it is back, because notices sent meanwhile are lost: the scheduler
then claims at once instead of trusting its planned wake-up.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import asyncpg  # type: ignore[import-untyped]

from app.db.async_engine import AsyncEngine
from app.logs import log_event
from app.store.partitions import PARTITIONS_CHANNEL

logger = logging.getLogger(__name__)

DUE_CHANNEL = "cronhook_jobs_due"
# How often a connection that seems idle is checked for life (asyncpg reports a lost
# connection only when it is used).
CHECK_S = 5.0
MAX_BACKOFF_S = 5.0

# SQLAlchemy's own connect options, which asyncpg.connect does not take.
_DIALECT_ONLY = ("prepared_statement_cache_size", "prepared_statement_name_func", "async_fallback")


class DueListener:
    def __init__(
        self,
        engine: AsyncEngine,
        on_due: Callable[[float | None], None],
        session_name: str | None = None,
        on_partitions: Callable[[str | None], None] | None = None,
    ) -> None:
        """`on_due(epoch_s)`: a job is due at that time (the database's clock); None: notices
        may have been missed (the connection was lost), look now. `session_name`: the
        connection's application_name (the replica's, app/store/rescues.py). `on_partitions`:
        a partition notice's payload; None each time the listener (re)connects, since notices
        sent before that were not heard."""
        self._engine = engine
        self._on_due = on_due
        self._session_name = session_name
        self._on_partitions = on_partitions

    async def _connect(self) -> Any:
        args, params = self._engine.dialect.create_connect_args(self._engine.url)
        for name in _DIALECT_ONLY:
            params.pop(name, None)
        if self._session_name:
            params["server_settings"] = {"application_name": self._session_name}
        return await asyncpg.connect(*args, **params)

    def _notice(self, connection: Any, pid: int, channel: str, payload: str) -> None:
        try:
            due: float | None = float(payload)
        except ValueError:
            due = None
        self._on_due(due)

    def _partition_notice(self, connection: Any, pid: int, channel: str, payload: str) -> None:
        assert self._on_partitions is not None
        self._on_partitions(payload)

    async def run(self, stop: asyncio.Event) -> None:
        backoff = 0.25
        lost = False
        while not stop.is_set():
            connection = None
            try:
                connection = await self._connect()
                closed = asyncio.Event()
                connection.add_termination_listener(lambda _c, done=closed: done.set())
                await connection.add_listener(DUE_CHANNEL, self._notice)
                if self._on_partitions is not None:
                    await connection.add_listener(PARTITIONS_CHANNEL, self._partition_notice)
                    self._on_partitions(None)
                if lost:
                    log_event(logger, "due_listener_reconnected")
                    self._on_due(None)
                lost, backoff = False, 0.25
                while not stop.is_set() and not closed.is_set():
                    stopping = asyncio.ensure_future(stop.wait())
                    try:
                        await asyncio.wait({stopping}, timeout=CHECK_S)
                    finally:
                        stopping.cancel()
                    if not stop.is_set() and not closed.is_set():
                        await asyncio.wait_for(connection.execute("SELECT 1"), CHECK_S)
                if closed.is_set():
                    raise ConnectionError("listening connection closed")
            except Exception as exc:
                if stop.is_set():
                    break
                if not lost:
                    log_event(logger, "due_listener_lost", logging.WARNING, error=type(exc).__name__)
                lost = True
                await _sleep_or_stop(stop, backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
            finally:
                if connection is not None:
                    connection.terminate()


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        pass
