"""Held occurrences of paused targets (STUB: being written)."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine


async def hold_watch_once(engine: AsyncEngine, limit: int) -> int:
    return 0
