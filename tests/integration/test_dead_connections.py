"""Pooled connections are not pinged before use: one found dead (the database restarted, or
ended the session) is replaced at the key look-up that opens every request, so no request
fails for it, a create included (which runs in autocommit without an Idempotency-Key)."""

from __future__ import annotations

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from app.db.engine import normalize_url
from tests.conftest import make_target, new_tenant
from tests.receiver import wait_for


async def end_other_sessions(db_url: str) -> int:
    """Ends every other session of the test database and returns once they are gone: the
    pooled connections are then dead, not dying (on a busy machine a backend can still run a
    statement for a moment after pg_terminate_backend, and die between two statements)."""
    admin = create_async_engine(normalize_url(db_url), poolclass=NullPool)
    others = "FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
    try:
        async with admin.connect() as conn:
            ended = int(await conn.scalar(text(f"SELECT count(pg_terminate_backend(pid)) {others}")) or 0)

            async def gone() -> bool:
                await conn.rollback()  # pg_stat_activity is read once per transaction
                return not await conn.scalar(text(f"SELECT count(*) {others}"))

            await wait_for(gone, timeout=30, interval=0.05, message="terminated sessions gone")
            return ended
    finally:
        await admin.dispose()


async def test_requests_succeed_after_the_pooled_connections_died(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine, db_url: str
) -> None:
    target = await make_target(client, auth, "http://127.0.0.1:9/hook")
    assert (await client.get("/v1/jobs", headers=auth)).status_code == 200
    assert await end_other_sessions(db_url) >= 1

    created = await client.post("/v1/jobs", json={"target_id": target["id"], "delay_s": 60}, headers=auth)
    assert created.status_code == 201, created.text
    await end_other_sessions(db_url)
    listed = await client.get("/v1/jobs", headers=auth)
    assert listed.status_code == 200 and [j["id"] for j in listed.json()["items"]] == [created.json()["id"]]
    await end_other_sessions(db_url)
    keyed = {**auth, "Idempotency-Key": "after-restart"}
    again = await client.post("/v1/jobs", json={"target_id": target["id"], "delay_s": 60}, headers=keyed)
    assert again.status_code == 201, again.text


async def test_a_keys_first_request_succeeds_after_the_pooled_connections_died(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine, db_url: str
) -> None:
    assert (await client.get("/v1/jobs", headers=auth)).status_code == 200
    # A key that has sent nothing yet: its first request reads the tenant's request quota on
    # a pooled connection of its own, before the request's connection (app/api/quotas.py).
    fresh = await new_tenant(engine)
    assert await end_other_sessions(db_url) >= 1
    listed = await client.get("/v1/jobs", headers=fresh)
    assert listed.status_code == 200, listed.text
