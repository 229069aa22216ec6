"""Alembic environment. `cronhook migrate` passes an open connection in
`config.attributes["connection"]`; a developer's `alembic` run uses CRONHOOK_DATABASE_URL."""

import asyncio
import os

from alembic import context
from sqlalchemy.engine import Connection

from app.db.engine import create_engine
from app.store.schema import metadata

config = context.config


def run_with_connection(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=metadata, compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


async def run_standalone() -> None:
    url = os.environ.get("CRONHOOK_DATABASE_URL")
    if not url:
        raise SystemExit("set CRONHOOK_DATABASE_URL, or use `cronhook migrate`")
    engine = create_engine(url, pool_size=1)
    async with engine.connect() as connection:
        await connection.run_sync(run_with_connection)
        await connection.commit()
    await engine.dispose()


existing = config.attributes.get("connection")
if existing is not None:
    run_with_connection(existing)
else:
    asyncio.run(run_standalone())
