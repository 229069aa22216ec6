"""The schema revision this release needs, and whether a database is at it, without Alembic:
the API's readiness probe asks on every call, and loading Alembic (and Mako) for it cost every
API process about 12 MB. The revision is the newest migration's id in alembic/versions;
tests/unit/test_schema_head.py fails when it drifts from what Alembic computes."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.exc import ProgrammingError

from app.db.async_engine import AsyncEngine

SCHEMA_HEAD = "0026"

_REVISION = text("SELECT version_num FROM alembic_version")


async def schema_is_current(engine: AsyncEngine) -> bool:
    """The database's revision (Alembic's one-row table) is SCHEMA_HEAD; False before the
    first migration (no such table)."""
    async with engine.connect() as connection:
        try:
            revisions = (await connection.execute(_REVISION)).scalars().all()
        except ProgrammingError:  # undefined table: never migrated
            return False
    return list(revisions) == [SCHEMA_HEAD]
