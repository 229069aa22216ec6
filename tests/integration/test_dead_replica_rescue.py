"""When is a replica's death certain (app/store/rescues.py)? Its heartbeat and partition
leases have expired, and either no session of its process is left on the server (rescued at
once) or its POSTs have had the target's timeout plus the lease margin to end (a replica that
is only stalled keeps its sessions, and its deliveries until then).

The replica is a row plus, where it is "alive", a real session carrying its session name;
the server's own pg_stat_activity decides."""

from __future__ import annotations

import datetime as dt
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg  # type: ignore[import-untyped]
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store.claims import job_claim_due
from app.store.partitions import replica_heartbeat
from app.store.rescues import job_lock_expired_leases, replica_session_name
from app.store.tables import replicas
from tests.conftest import TEST_KEY_RING
from tests.factories import make_jobs, make_tenant_and_target

TARGET_TIMEOUT_S = 5.0
MARGIN_S = 5.0


@asynccontextmanager
async def session_of(db_url: str, replica_id: str) -> AsyncIterator[Any]:
    """A database session named as the replica's process names its own."""
    dsn = db_url.replace("postgresql+asyncpg://", "postgresql://", 1)
    conn = await asyncpg.connect(dsn, server_settings={"application_name": replica_session_name(replica_id)})
    try:
        yield conn
    finally:
        await conn.close()


async def claimed_by_lapsed_replica(engine: AsyncEngine, heartbeat_age_s: float, expired_for_s: float) -> str:
    """A running job leased to a replica whose heartbeat (`heartbeat_age_s` ago) expired
    `expired_for_s` ago and which holds no partition lease."""
    replica_id = f"replica-{secrets.token_hex(4)}"
    tenant, target = await make_tenant_and_target(engine, "http://127.0.0.1:9/", timeout_s=TARGET_TIMEOUT_S)
    await make_jobs(engine, tenant, target, 1)
    async with engine.begin() as conn:
        await replica_heartbeat(conn, replica_id, 60)
        (job,) = await job_claim_due(conn, TEST_KEY_RING, replica_id, 1, 600)
        await conn.execute(
            update(replicas)
            .where(replicas.c.id == replica_id)
            .values(
                heartbeat_at=replicas.c.heartbeat_at - dt.timedelta(seconds=heartbeat_age_s),
                expires_at=replicas.c.heartbeat_at - dt.timedelta(seconds=expired_for_s),
            )
        )
    assert job.lease_owner == replica_id
    return replica_id


async def rescuable(engine: AsyncEngine, fast: bool = True) -> list[tuple[str, bool]]:
    async with engine.begin() as conn:
        leases = await job_lock_expired_leases(conn, TEST_KEY_RING, 100, margin_s=MARGIN_S, fast=fast)
    return [(lease.job.lease_owner or "", lease.owner_dead) for lease in leases]


def test_session_names_fit_postgres_and_tell_replicas_apart() -> None:
    long_id = "a-very-long-host-name.example.internal-" * 4 + "-1234-abcdef"
    names = {replica_session_name(rid) for rid in (long_id, long_id + "x", "h-1-aa", "h-1-ab")}
    assert len(names) == 4
    assert all(len(name) < 64 and name.isascii() for name in names)


async def test_a_replica_whose_process_is_gone_has_its_jobs_rescued_at_once(engine: AsyncEngine) -> None:
    # Heartbeat lapsed 1 s ago: far less than the target's timeout plus the margin.
    replica_id = await claimed_by_lapsed_replica(engine, heartbeat_age_s=0, expired_for_s=1)
    assert await rescuable(engine) == [(replica_id, True)]


async def test_a_stalled_replica_with_a_live_session_keeps_its_deliveries_until_they_can_have_ended(
    engine: AsyncEngine, db_url: str
) -> None:
    replica_id = await claimed_by_lapsed_replica(engine, heartbeat_age_s=0, expired_for_s=1)
    async with session_of(db_url, replica_id):
        assert await rescuable(engine) == []
    # The session closed with its process: now its death is certain.
    assert await rescuable(engine) == [(replica_id, True)]


async def test_a_live_session_does_not_hold_jobs_past_the_timeout_and_margin(engine: AsyncEngine, db_url: str) -> None:
    lapsed_s = TARGET_TIMEOUT_S + MARGIN_S + 1
    replica_id = await claimed_by_lapsed_replica(engine, heartbeat_age_s=lapsed_s + 15, expired_for_s=lapsed_s)
    async with session_of(db_url, replica_id):
        assert await rescuable(engine) == [(replica_id, True)]


async def test_no_session_is_no_proof_on_another_server_instance_than_the_heartbeats(engine: AsyncEngine) -> None:
    # The heartbeat was written before a restart, or on the primary before a failover: every
    # session ended with that instance, while the process may live on, reconnecting.
    replica_id = await claimed_by_lapsed_replica(engine, heartbeat_age_s=0, expired_for_s=1)
    async with engine.begin() as conn:
        await conn.execute(
            update(replicas)
            .where(replicas.c.id == replica_id)
            .values(server_started_at=replicas.c.server_started_at - dt.timedelta(hours=1))
        )
    assert await rescuable(engine) == []


async def test_fast_rescue_off_waits_for_the_timeout_and_margin(engine: AsyncEngine) -> None:
    # Behind a transaction-mode pooler no session names a process: the setting turns the
    # session evidence off.
    await claimed_by_lapsed_replica(engine, heartbeat_age_s=0, expired_for_s=1)
    assert await rescuable(engine, fast=False) == []


async def test_a_live_heartbeat_is_never_death_even_without_a_session(engine: AsyncEngine) -> None:
    replica_id = f"replica-{secrets.token_hex(4)}"
    tenant, target = await make_tenant_and_target(engine, "http://127.0.0.1:9/", timeout_s=TARGET_TIMEOUT_S)
    await make_jobs(engine, tenant, target, 1)
    async with engine.begin() as conn:
        await replica_heartbeat(conn, replica_id, 60)
        await job_claim_due(conn, TEST_KEY_RING, replica_id, 1, 600)
    assert await rescuable(engine) == []
