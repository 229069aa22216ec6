"""An API process's warm-up before it serves: sessions of its pool with the single create's
statements (with and without the key check) and the key look-up prepared, writing nothing;
and a database it cannot reach, or not migrated yet, only costs it the warm-up."""

from __future__ import annotations

import contextlib

from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncConnection

from app.api.warm_up import warm_up_api
from app.db.engine import create_engine
from app.store.tables import audit_log, jobs, tenant_job_deltas
from tests.conftest import admin_execute, database_url, new_database_name


async def _prepared_on(conn: AsyncConnection) -> list[str]:
    return list((await conn.execute(text("SELECT statement FROM pg_prepared_statements"))).scalars())


def _create_path_prepared(prepared: list[str]) -> bool:
    creates = [s for s in prepared if "INSERT INTO jobs" in s and "INSERT INTO audit_log" in s]
    for_key = [s for s in creates if "api_keys.key_hash" in s]
    look_up = [s for s in prepared if "FROM api_keys" in s and "INSERT" not in s]
    return len(creates) == 2 and len(for_key) == 1 and len(look_up) == 1


async def test_warm_up_prepares_the_create_path_on_that_many_sessions_and_writes_nothing(db_url: str) -> None:
    engine = create_engine(db_url, pool_size=3)  # 6 pooled
    try:
        await warm_up_api(engine, 3)
        async with contextlib.AsyncExitStack() as stack:
            pooled = [
                await stack.enter_async_context(engine.connect())
                for _ in range(engine.pool.checkedin())  # type: ignore[attr-defined]
            ]
            assert len(pooled) == 3  # the warm-up's, kept in the pool
            assert all([_create_path_prepared(await _prepared_on(conn)) for conn in pooled])
            conn = pooled[0]
            for table in (jobs, audit_log, tenant_job_deltas):
                assert await conn.scalar(select(func.count()).select_from(table)) == 0
    finally:
        await engine.dispose()


async def test_a_database_out_of_reach_costs_only_the_warm_up() -> None:
    engine = create_engine("postgresql://postgres@127.0.0.1:1/nothing", pool_size=2)
    try:
        await warm_up_api(engine, 2)  # logged, not raised: requests open sessions as they need them
    finally:
        await engine.dispose()


async def test_a_database_not_migrated_yet_costs_only_the_warm_up(pg_server_url: str) -> None:
    # An API started before `cronhook migrate` (CRONHOOK_AUTO_MIGRATE=false) serves, and
    # /readyz says the schema is behind: its warm-up's errors must not stop it.
    name = new_database_name("_bare")
    await admin_execute(pg_server_url, f'CREATE DATABASE "{name}"')
    engine = create_engine(database_url(pg_server_url, name), pool_size=2)
    try:
        await warm_up_api(engine, 2)
    finally:
        await engine.dispose()
        await admin_execute(pg_server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
