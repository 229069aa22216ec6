"""The check watch, one of the reaper's passes (app/services/reaper.py): checks whose ping is
overdue past their grace (alert_at) go down, each reporting check.down in the transaction
that moves it (app/store/check_ins.py), and each check's pings are trimmed to its newest
`pings_kept`. Overdue checks are taken in batches of `limit`, each its own short
transaction, until none is left; checks another watch holds are skipped, not waited for.
"""

from __future__ import annotations

import logging

from app.db.async_engine import AsyncEngine
from app.domain.events import EventType
from app.logs import log_event
from app.store.check_ins import check_emit, check_mark_overdue_down, check_ping_trim

logger = logging.getLogger(__name__)


async def check_watch_once(engine: AsyncEngine, limit: int, pings_kept: int) -> int:
    """Moves every overdue check down; returns how many went down."""
    went_down = 0
    while True:
        async with engine.begin() as conn:
            down = await check_mark_overdue_down(conn, limit)
            for check in down:
                await check_emit(conn, check, EventType.CHECK_DOWN)
        for check in down:
            log_event(logger, "check_down", logging.INFO, check_id=str(check["id"]), tenant_id=str(check["tenant_id"]))
        went_down += len(down)
        if len(down) < limit:
            break
    async with engine.begin() as conn:
        await check_ping_trim(conn, pings_kept, limit)
    return went_down
