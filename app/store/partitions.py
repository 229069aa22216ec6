"""Replicas and partition leases: membership, acquisition, renewal, release, and the cluster view.

A partition lease row names one owner, an epoch and an expiry. Every statement that keeps or
gives up a lease matches (owner, partition, epoch), so a replica that lost a partition (it
stalled, the lease expired, another replica acquired it with a higher epoch) can neither
renew nor release what is no longer its own. All times come from the database's `now()`.
"""

from __future__ import annotations

import datetime as dt
import enum
from dataclasses import dataclass

from sqlalchemy import delete, func, select, tuple_, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.sql.elements import ColumnElement

from app.db.async_engine import AsyncConnection
from app.domain.states import CLAIMABLE_STATES
from app.store.tables import jobs, partition_leases, replicas

# partition -> epoch under which this replica holds it.
Held = dict[int, int]

# The scheduler replicas LISTEN here (app/services/due_listener.py) for `<event> <replica id>`:
# a replica joined short of its share, released surplus, or left. Each tells the others to run
# an ownership round now instead of at their next renewal, so partitions change hands in
# milliseconds rather than a round or two later.
PARTITIONS_CHANNEL = "cronhook_partitions"


class PartitionEvent(enum.StrEnum):
    JOINED = "joined"  # short of its fair share: holders of surplus, release it
    RELEASED = "released"  # surplus given up: whoever is short, take it
    LEFT = "left"  # gone (clean shutdown), its partitions free: take your new share


def _ttl(seconds: float) -> object:
    return func.now() + dt.timedelta(seconds=seconds)


async def replica_heartbeat(conn: AsyncConnection, replica_id: str, ttl_s: float) -> list[str]:
    """Records that `replica_id` is alive for `ttl_s` more; returns the live replicas' ids."""
    server = func.pg_postmaster_start_time()
    stmt = insert(replicas).values(id=replica_id, expires_at=_ttl(ttl_s), server_started_at=server)
    stmt = stmt.on_conflict_do_update(
        index_elements=[replicas.c.id],
        set_={"heartbeat_at": func.now(), "expires_at": _ttl(ttl_s), "server_started_at": server},
    )
    await conn.execute(stmt)
    # Forget replicas that have been gone for a while; a live one re-inserts itself.
    await conn.execute(delete(replicas).where(replicas.c.expires_at < func.now() - dt.timedelta(hours=1)))
    rows = await conn.execute(select(replicas.c.id).where(replicas.c.expires_at > func.now()).order_by(replicas.c.id))
    return [row.id for row in rows]


async def replica_remove(conn: AsyncConnection, replica_id: str) -> None:
    """Marks a replica gone (clean shutdown): expired now, so the reaper rescues any delivery
    it cancelled at once; the row itself goes with the next heartbeat's clean-up."""
    await conn.execute(update(replicas).where(replicas.c.id == replica_id).values(expires_at=func.now()))


async def partitions_announce(conn: AsyncConnection, replica_id: str, event: str) -> None:
    """Tells the other replicas that partitions changed hands or should (PARTITIONS_CHANNEL);
    sent when the transaction commits, so a listener sees what it announces."""
    await conn.execute(select(func.pg_notify(PARTITIONS_CHANNEL, f"{event} {replica_id}")))


def partition_notice_sender(payload: str) -> str:
    """The replica that sent a PARTITIONS_CHANNEL notice."""
    return payload.partition(" ")[2]


def _held_by(owner: str, held: Held) -> list[ColumnElement[bool]]:
    return [
        partition_leases.c.owner == owner,
        tuple_(partition_leases.c.partition, partition_leases.c.epoch).in_(sorted(held.items())),
    ]


async def partition_renew(conn: AsyncConnection, owner: str, held: Held, ttl_s: float) -> Held:
    """Extends the unexpired leases `owner` holds with the epochs in `held`; returns those kept."""
    if not held:
        return {}
    stmt = (
        update(partition_leases)
        .where(*_held_by(owner, held), partition_leases.c.expires_at > func.now())
        .values(expires_at=_ttl(ttl_s))
        .returning(partition_leases.c.partition, partition_leases.c.epoch)
    )
    return {row.partition: row.epoch for row in await conn.execute(stmt)}


async def partition_acquire(conn: AsyncConnection, owner: str, count: int, ttl_s: float) -> Held:
    """Takes up to `count` free or expired partitions, each under a new (higher) epoch."""
    if count <= 0:
        return {}
    free = (
        select(partition_leases.c.partition)
        .where((partition_leases.c.owner.is_(None)) | (partition_leases.c.expires_at <= func.now()))
        .order_by(partition_leases.c.partition)
        .limit(count)
        .with_for_update(skip_locked=True)
        .cte("free")
    )
    stmt = (
        update(partition_leases)
        .where(partition_leases.c.partition == free.c.partition)
        .values(
            owner=owner,
            epoch=partition_leases.c.epoch + 1,
            expires_at=_ttl(ttl_s),
            acquired_at=func.now(),
        )
        .returning(partition_leases.c.partition, partition_leases.c.epoch)
    )
    return {row.partition: row.epoch for row in await conn.execute(stmt)}


async def partition_release(conn: AsyncConnection, owner: str, held: Held) -> list[int]:
    """Gives up leases (surplus after a join, or all on shutdown); returns those released."""
    if not held:
        return []
    stmt = (
        update(partition_leases)
        .where(*_held_by(owner, held))
        .values(owner=None, expires_at=None)
        .returning(partition_leases.c.partition)
    )
    return [row.partition for row in await conn.execute(stmt)]


@dataclass(frozen=True)
class PartitionLease:
    partition: int
    owner: str | None
    epoch: int
    expires_at: dt.datetime | None
    live: bool
    # The oldest claimable job that is already due in this partition, if any.
    oldest_due_at: dt.datetime | None


@dataclass(frozen=True)
class ClusterView:
    now: dt.datetime
    replicas: list[tuple[str, dt.datetime, dt.datetime, dt.datetime]]  # id, started, heartbeat, expires
    partitions: list[PartitionLease]


async def cluster_view(conn: AsyncConnection) -> ClusterView:
    now = await conn.scalar(select(func.now()))
    assert now is not None
    replica_rows = await conn.execute(
        select(replicas.c.id, replicas.c.started_at, replicas.c.heartbeat_at, replicas.c.expires_at)
        .where(replicas.c.expires_at > func.now())
        .order_by(replicas.c.id)
    )
    # One index probe per partition (ix_jobs_partition_due), however large the backlog.
    oldest_due = (
        select(func.min(jobs.c.run_at))
        .where(
            jobs.c.partition == partition_leases.c.partition,
            jobs.c.state.in_([s.value for s in CLAIMABLE_STATES]),
            jobs.c.run_at <= func.now(),
        )
        .scalar_subquery()
    )
    lease_rows = await conn.execute(
        select(
            partition_leases.c.partition,
            partition_leases.c.owner,
            partition_leases.c.epoch,
            partition_leases.c.expires_at,
            (partition_leases.c.expires_at > func.now()).label("live"),
            oldest_due.label("oldest_due_at"),
        ).order_by(partition_leases.c.partition)
    )
    return ClusterView(
        now=now,
        replicas=[(r.id, r.started_at, r.heartbeat_at, r.expires_at) for r in replica_rows],
        partitions=[
            PartitionLease(r.partition, r.owner, r.epoch, r.expires_at, bool(r.live), r.oldest_due_at)
            for r in lease_rows
        ],
    )
