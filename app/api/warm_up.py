"""What a new API process prepares before it serves: sessions in its pool with the single
create's statements (and the key look-up) run once on each, so a restart or a deploy does not
make its first requests pay for connecting, the driver's type look-ups, SQLAlchemy's
compilation and PostgreSQL's first plans. Measured before: the first create 28-32 ms, and
the first 32 at once 250-290 ms at the median (46-77 ms for the next 32)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from sqlalchemy.exc import DBAPIError

from app.db.async_engine import AsyncEngine
from app.db.errors import is_transient_db_error, outage_reason
from app.logs import log_event
from app.store.job_inserts import job_create_warm_up
from app.store.tenants import api_key_caller

logger = logging.getLogger(__name__)

# The longest start-up waits for it: past this the process serves; what was still opening or
# running is cancelled, and requests open sessions as they need them.
WARM_UP_MAX_S = 5.0


async def warm_up_api(engine: AsyncEngine, sessions: int) -> None:
    """Opens `sessions` pooled sessions at once and runs the create path's statements on each
    (writing nothing). Only time is at stake: a database that is slow or answers with any
    error (out of reach, refusing connections, a schema not migrated yet, a permission) is
    logged, and the process serves as it would have; /readyz reports what is wrong. Anything
    else is a bug, raised."""
    async with contextlib.AsyncExitStack() as held:
        try:
            async with asyncio.timeout(WARM_UP_MAX_S):
                # All held at once, so each is a session of its own.
                warmed = [_warm_session(engine, held) for _ in range(max(1, sessions))]
                results = await asyncio.gather(*warmed, return_exceptions=True)
        except TimeoutError:
            log_event(logger, "api_warm_up_slow", logging.WARNING, limit_s=WARM_UP_MAX_S)
            return
    failures = [result for result in results if isinstance(result, BaseException)]
    for failure in failures:
        # A database's answer (any DBAPIError) or a connection that failed is logged below.
        if not (isinstance(failure, DBAPIError) or is_transient_db_error(failure)):
            raise failure
    if failures:
        first = failures[0]
        reason = outage_reason(first) if is_transient_db_error(first) else type(getattr(first, "orig", first)).__name__
        log_event(logger, "api_warm_up_failed", logging.WARNING, sessions=len(failures), reason=reason)


async def _warm_session(engine: AsyncEngine, stack: contextlib.AsyncExitStack) -> None:
    conn = await stack.enter_async_context(engine.connect())
    await conn.execution_options(isolation_level="AUTOCOMMIT")  # as a create's
    await api_key_caller(conn, "")  # no such key: the look-up's plan, no row
    await job_create_warm_up(conn)
