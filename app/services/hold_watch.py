"""The reaper's pass over paused targets and tenants (app/store/pauses.py): pauses whose
`paused_until` has passed are resumed (delivering everything they held, target.resumed
emitted); occurrences of paused targets that came due, or nearly, since the pause (created,
retried, next occurrences) are held; and held occurrences no pause holds any more are
released. Each in short transactions of its own; each step does at most `limit` of its work
a pass, except holding, which goes on while batches come back full (up to MAX_HOLD_BATCHES):
until they are held, every claim reads past them.
"""

from __future__ import annotations

import logging

from app.db.async_engine import AsyncEngine
from app.domain.occurrences import OnResume
from app.logs import log_event
from app.store.pauses import (
    job_hold_due,
    job_release_held,
    target_list_pause_expired,
    target_list_unheld,
    target_lock_unpaused,
    target_resume,
    tenant_list_pause_expired,
    tenant_resume,
)

logger = logging.getLogger(__name__)

MAX_HOLD_BATCHES = 20


async def hold_watch_once(engine: AsyncEngine, limit: int) -> int:
    """One pass; returns the occurrences it held or released."""
    moved = await _resume_expired(engine, limit)
    for _ in range(MAX_HOLD_BATCHES):
        async with engine.begin() as conn:
            held = await job_hold_due(conn, limit)
        moved += held
        if held < limit:
            break
    async with engine.connect() as conn:
        unheld = await target_list_unheld(conn, limit)
    for target_id in unheld:
        async with engine.begin() as conn:
            if not await target_lock_unpaused(conn, target_id):
                continue
            released = await job_release_held(conn, [target_id], OnResume.DELIVER_ALL, None)
        moved += released
        if released:
            log_event(logger, "held_released_unpaused", target_id=str(target_id), released=released)
    return moved


async def _resume_expired(engine: AsyncEngine, limit: int) -> int:
    """Resumes the targets and tenants whose pause was until a time that has passed."""
    released = 0
    async with engine.connect() as conn:
        targets = await target_list_pause_expired(conn, limit)
        tenants = await tenant_list_pause_expired(conn, limit)
    for tenant_id, target_id in targets:
        async with engine.begin() as conn:
            change = await target_resume(conn, tenant_id, target_id, OnResume.DELIVER_ALL, None, expired_only=True)
        if change is not None and change.edge:
            released += change.count
            log_event(logger, "target_pause_expired", target_id=str(target_id), released=change.count)
    for tenant_id in tenants:
        async with engine.begin() as conn:
            change = await tenant_resume(conn, tenant_id, OnResume.DELIVER_ALL, None, expired_only=True)
        if change is not None and change.edge:
            released += change.count
            log_event(logger, "tenant_pause_expired", tenant_id=str(tenant_id), released=change.count)
    return released
