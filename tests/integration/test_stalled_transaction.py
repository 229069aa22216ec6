"""A process that stalls inside a transaction (SIGSTOP, a frozen VM) must not hide the job rows
it locked: SKIP LOCKED would make every other scheduler and the reaper pass over them for as
long as the stall lasted. PostgreSQL ends such a session after the idle-in-transaction timeout."""

from __future__ import annotations

import contextlib
import os

import httpx
import pytest
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.engine import create_engine
from app.store.claims import job_claim_due
from app.store.tables import jobs
from tests.conftest import TEST_KEY_RING, make_job, make_target
from tests.receiver import wait_for


# Under an injected clock (make pytest-dates, libfaketime) PostgreSQL's idle-in-transaction
# timer never fires; nothing here depends on the date.
@pytest.mark.skipif(bool(os.environ.get("FAKETIME")), reason="libfaketime stops PostgreSQL's session timers")
async def test_rows_locked_by_a_stalled_transaction_are_claimable_after_the_timeout(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine, db_url: str
) -> None:
    target = await make_target(client, auth, "http://127.0.0.1:9/hook")
    job = await make_job(client, auth, target["id"])
    idle_timeout_s = 3.0
    stalled = create_engine(db_url, pool_size=1, idle_in_transaction_timeout_s=idle_timeout_s)
    conn = await stalled.connect()
    try:
        transaction = await conn.begin()
        # The stalled replica's claim had locked the row, then the process stopped.
        await conn.execute(select(jobs.c.id).where(jobs.c.id == job["id"]).with_for_update())
        backend = await conn.scalar(select(func.pg_backend_pid()))

        claimed: list[str] = []

        async def claimable() -> bool:
            async with engine.begin() as other:
                claimed.extend(str(j.id) for j in await job_claim_due(other, TEST_KEY_RING, "survivor", 10, 30))
            return bool(claimed)

        async def stalled_session_alive() -> bool:
            async with engine.connect() as watcher:
                state: str | None = await watcher.scalar(
                    text("SELECT state FROM pg_stat_activity WHERE pid = :pid"), {"pid": backend}
                )
            return state == "idle in transaction"

        # Skipped while the lock is held: checked only while the server says the stalled
        # session is still there (a busy machine may take longer than the timeout to get here).
        found = await claimable()
        if await stalled_session_alive():
            assert not found, "a row locked by a live transaction was claimed"
        await wait_for(claimable, timeout=idle_timeout_s * 10, interval=0.2, message="the lock released by the server")
        assert claimed == [job["id"]]  # ...and taken once the server ended the stalled session
        assert not await stalled_session_alive()
        with contextlib.suppress(Exception):  # its connection is gone; rolling back may fail
            await transaction.rollback()
    finally:
        with contextlib.suppress(Exception):
            await conn.close()
        await stalled.dispose()
