"""Applying and checking the alembic migrations that ship with the package."""

from __future__ import annotations

import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.engine import Connection

from app.db.async_engine import AsyncEngine
from app.logs import log_event

logger = logging.getLogger(__name__)

# Any fixed number: serialises concurrent `migrate` runs (several replicas starting at once).
_MIGRATION_LOCK_ID = 0x63726F6E68  # "cronh"


def script_location() -> Path:
    package_dir = Path(__file__).resolve().parent.parent
    shipped = package_dir / "_migrations"  # inside an installed wheel
    if shipped.is_dir():
        return shipped
    return package_dir.parent / "alembic"  # a source checkout / editable install


def alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(script_location()))
    return config


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


async def migrate_to_head(engine: AsyncEngine) -> None:
    async with engine.connect() as connection:
        await connection.execute(text("SELECT pg_advisory_lock(:id)"), {"id": _MIGRATION_LOCK_ID})
        try:
            before = await connection.run_sync(revision_of)
            await connection.run_sync(_upgrade)
            await connection.commit()
            head = head_revision()
            if before != head:
                log_event(logger, "schema_migrated", from_revision=before, to_revision=head)
        finally:
            # After a failed migration the transaction is aborted: roll back first, or the
            # unlock fails too and hides the real error.
            await connection.rollback()
            await connection.execute(text("SELECT pg_advisory_unlock(:id)"), {"id": _MIGRATION_LOCK_ID})
            await connection.commit()


def _upgrade(connection: Connection) -> None:
    config = alembic_config()
    config.attributes["connection"] = connection
    command.upgrade(config, "head")


def revision_of(connection: Connection) -> str | None:
    """The schema revision of the connected database (None before the first migration)."""
    return MigrationContext.configure(connection).get_current_revision()


async def schema_is_current(engine: AsyncEngine) -> bool:
    """As Alembic sees it (app/db/schema_head.py answers the same without loading Alembic)."""
    async with engine.connect() as connection:
        return await connection.run_sync(revision_of) == head_revision()
