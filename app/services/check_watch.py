"""Overdue check-ins (STUB: being written)."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine


async def check_watch_once(engine: AsyncEngine, limit: int, pings_kept: int) -> int:
    return 0
