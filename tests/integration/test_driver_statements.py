"""Statements run on the driver's connection (app/db/driver.py) behave as through SQLAlchemy:
the same row and types, the transaction respected, and errors raised as SQLAlchemy raises
them, a dead connection included."""

from __future__ import annotations

import asyncio
import uuid

import httpx
import pytest
from sqlalchemy import DateTime, Float, bindparam, func, literal, select, text
from sqlalchemy.dialects.postgresql import ARRAY, UUID
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import QueuePool

from app.db.driver import DriverStatement, driver_fetch_all, driver_fetch_one
from app.db.errors import is_transient_db_error
from app.domain.states import JobState
from app.store.tables import jobs, tenants
from tests.conftest import make_job, make_target
from tests.integration.test_dead_connections import end_other_sessions
from tests.receiver import wait_for

_JOB = DriverStatement(
    select(jobs, literal("fixed").label("fixed")).where(jobs.c.id == bindparam("id"), jobs.c.priority >= 0)
)
_SLEEP = DriverStatement(select(func.pg_sleep(bindparam("seconds", type_=Float())).label("slept")))
_TENANT_INSERT = DriverStatement(
    tenants.insert().values(id=bindparam("id"), name=bindparam("name")).returning(tenants.c.id, tenants.c.name)
)


async def test_a_row_is_the_one_sqlalchemy_returns(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine
) -> None:
    target = await make_target(client, auth, "http://127.0.0.1:9/hook")
    job = await make_job(client, auth, target["id"], cron="0 9 * * *", timezone="Europe/Berlin")
    job_id = uuid.UUID(job["id"])
    async with engine.connect() as conn:
        await conn.execution_options(isolation_level="AUTOCOMMIT")
        by_driver = await driver_fetch_one(conn, _JOB, {"id": job_id})
        by_sqlalchemy = (await conn.execute(_JOB.statement, {"id": job_id})).mappings().one()
        assert await driver_fetch_one(conn, _JOB, {"id": uuid.uuid4()}) is None
    assert by_driver is not None
    assert dict(by_driver) == dict(by_sqlalchemy)
    assert by_driver["state"] is JobState.SCHEDULED and by_driver["fixed"] == "fixed"
    assert by_driver["payload"] == {"hello": "world"}


_UNNEST = DriverStatement(
    select(
        func.unnest(bindparam("ids", type_=ARRAY(UUID(as_uuid=True)))).label("id"),
        func.unnest(bindparam("times", type_=ARRAY(DateTime(timezone=True)))).label("at"),
    )
)


async def test_rows_of_array_parameters_are_the_ones_sqlalchemy_returns(engine: AsyncEngine) -> None:
    import datetime as dt

    ids = [uuid.uuid4() for _ in range(3)]
    times = [dt.datetime(2026, 11, 25, 12, i, tzinfo=dt.UTC) for i in range(3)]
    async with engine.connect() as conn:
        await conn.execution_options(isolation_level="AUTOCOMMIT")
        by_driver = await driver_fetch_all(conn, _UNNEST, {"ids": ids, "times": times})
        by_sqlalchemy = (await conn.execute(_UNNEST.statement, {"ids": ids, "times": times})).mappings().all()
        assert await driver_fetch_all(conn, _UNNEST, {"ids": [], "times": []}) == []
    assert [dict(row) for row in by_driver] == [dict(row) for row in by_sqlalchemy]
    assert [(row["id"], row["at"]) for row in by_driver] == list(zip(ids, times, strict=True))


async def test_inside_a_transaction_the_statement_is_part_of_it(engine: AsyncEngine) -> None:
    tenant_id = uuid.uuid4()
    async with engine.connect() as conn:
        row = await driver_fetch_one(conn, _TENANT_INSERT, {"id": tenant_id, "name": f"t-{tenant_id.hex[:8]}"})
        assert row is not None and row["id"] == tenant_id
        await conn.rollback()
    async with engine.connect() as conn:
        assert await conn.scalar(select(tenants.c.id).where(tenants.c.id == tenant_id)) is None


async def test_errors_are_sqlalchemys_and_a_dead_connection_is_replaced(engine: AsyncEngine, db_url: str) -> None:
    name = f"t-{uuid.uuid4().hex[:8]}"
    async with engine.connect() as conn:
        await conn.execution_options(isolation_level="AUTOCOMMIT")
        await driver_fetch_one(conn, _TENANT_INSERT, {"id": uuid.uuid4(), "name": name})
        with pytest.raises(IntegrityError) as duplicate:
            await driver_fetch_one(conn, _TENANT_INSERT, {"id": uuid.uuid4(), "name": name})
        assert getattr(duplicate.value.orig, "sqlstate", None) == "23505"
        assert not duplicate.value.connection_invalidated and not is_transient_db_error(duplicate.value)
        # The connection is still good after an ordinary error (autocommit: nothing to roll back).
        assert await conn.scalar(text("SELECT 1")) == 1

    async with engine.connect() as conn:
        await conn.execution_options(isolation_level="AUTOCOMMIT")
        assert await conn.scalar(text("SELECT 1")) == 1  # checked out, then its session ended
        await end_other_sessions(db_url)
        with pytest.raises(DBAPIError) as dead:
            await driver_fetch_one(conn, _TENANT_INSERT, {"id": uuid.uuid4(), "name": f"{name}-2"})
        assert dead.value.connection_invalidated and is_transient_db_error(dead.value)
    # The pool dropped its connections from before: the next checkout is a live one.
    async with engine.connect() as conn:
        await conn.execution_options(isolation_level="AUTOCOMMIT")
        row = await driver_fetch_one(conn, _TENANT_INSERT, {"id": uuid.uuid4(), "name": f"{name}-3"})
        assert row is not None and row["name"] == f"{name}-3"


async def test_a_cancelled_or_timed_out_statement_ends_as_cancelled_and_frees_its_connection(
    engine: AsyncEngine,
) -> None:
    async def sleep_in_autocommit() -> None:
        async with engine.connect() as conn:
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            await driver_fetch_one(conn, _SLEEP, {"seconds": 20})

    async def sleeping() -> bool:
        async with engine.connect() as conn:
            # This test's database only: other xdist workers may share the server.
            running = (
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND state = 'active' AND query LIKE '%pg_sleep%'"
            )
            return bool(await conn.scalar(text(running + " AND pid <> pg_backend_pid()")))

    task = asyncio.create_task(sleep_in_autocommit())
    # Cancelled while the statement runs on the server.
    await wait_for(sleeping, timeout=30, interval=0.02, message="the statement running")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(sleep_in_autocommit(), timeout=0.3)
    pool = engine.pool
    assert isinstance(pool, QueuePool)
    assert pool.checkedout() == 0
    # The pool still serves.
    async with engine.connect() as conn:
        await conn.execution_options(isolation_level="AUTOCOMMIT")
        assert await driver_fetch_one(conn, _SLEEP, {"seconds": 0}) == {"slept": None}
