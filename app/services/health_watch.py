"""Health edges (STUB: being written)."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.health import HealthDefaults


async def health_watch_once(engine: AsyncEngine, defaults: HealthDefaults, limit: int) -> int:
    return 0
