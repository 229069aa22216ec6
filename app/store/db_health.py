"""The database's health as the service sees it: a commit probe, this process's sessions'
waits (for a stall warning), and whether any scheduler of the cluster is alive. Used by
app/services/db_health.py; none of it is on a hot path."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Double, Text, column, func, select, table, text

from app.db.async_engine import AsyncConnection
from app.domain.partition import PARTITION_COUNT
from app.store.tables import partition_leases, replicas

# A commit as the service's writes make them, without a table: a transactional WAL message
# gives the transaction an id and WAL of its own, so its commit is flushed and waits for a
# synchronous standby. (A transaction that only takes an id writes its commit record
# asynchronously and waits for nothing: it would pass through a stall.)
_COMMIT_PROBE = text("SELECT pg_logical_emit_message(true, 'cronhook.probe', '')")
# Where EXECUTE on that function is revoked: a commit that takes a transaction id, which sees
# a server that stopped answering but not a commit waiting for a synchronous standby.
_WEAK_COMMIT_PROBE = text("SELECT pg_current_xact_id()")
_pg_stat_activity = table(
    "pg_stat_activity",
    column("pid"),
    column("application_name", Text),
    column("state", Text),
    column("wait_event_type", Text),
    column("wait_event", Text),
    column("query_start"),
)
# A replica gone this long is forgotten (app/store/partitions.py deletes its row after an hour).
_RECENT = dt.timedelta(hours=1)


async def database_commit_probe(conn: AsyncConnection, weak: bool = False) -> None:
    """One committed transaction (`conn` in autocommit); `weak`: the fallback above."""
    await conn.execute(_WEAK_COMMIT_PROBE if weak else _COMMIT_PROBE)


async def session_waits(conn: AsyncConnection, application_name: str, limit: int = 5) -> list[dict[str, Any]]:
    """What this process's busy sessions wait for, longest-running first."""
    running_s = func.extract("epoch", func.now() - _pg_stat_activity.c.query_start).cast(Double)
    stmt = (
        select(
            _pg_stat_activity.c.wait_event_type,
            _pg_stat_activity.c.wait_event,
            running_s.label("running_s"),
        )
        .where(
            _pg_stat_activity.c.application_name == application_name,
            _pg_stat_activity.c.state == "active",
            _pg_stat_activity.c.pid != func.pg_backend_pid(),
        )
        .order_by(_pg_stat_activity.c.query_start)
        .limit(limit)
    )
    rows = await conn.execute(stmt)
    return [dict(row._mapping) for row in rows]


async def schedulers_live(conn: AsyncConnection) -> bool | None:
    """True when a scheduler's heartbeat is current; False when schedulers were seen within
    the hour but none is now; None when none was (an API alone, or a cluster just made)."""
    live = func.count().filter(replicas.c.expires_at > func.now())
    recent = func.count().filter(replicas.c.heartbeat_at > func.now() - _RECENT)
    row = (await conn.execute(select(live.label("live"), recent.label("recent")))).one()
    if row.live:
        return True
    return False if row.recent else None


# The partitions held now, the live schedulers, how many of them hold any, and the fewest
# partitions any holder has.
_OWNED = (
    select(partition_leases.c.owner)
    .where(partition_leases.c.owner.is_not(None), partition_leases.c.expires_at > func.now())
    .cte("owned")
)
_PER_OWNER = select(func.count().label("n")).select_from(_OWNED).group_by(_OWNED.c.owner).subquery("per_owner")
_OWNERSHIP = select(
    select(func.count()).select_from(_OWNED).scalar_subquery().label("held"),
    select(func.count()).where(replicas.c.expires_at > func.now()).scalar_subquery().label("live"),
    select(func.count(_OWNED.c.owner.distinct())).scalar_subquery().label("holders"),
    select(func.coalesce(func.min(_PER_OWNER.c.n), 0)).scalar_subquery().label("fewest"),
)


@dataclass(frozen=True)
class Ownership:
    held: int
    live: int
    holders: int
    fewest: int

    def settling(self, schedulers: int) -> str | None:
        """Why the partitions are not settled yet for `schedulers` starting schedulers, or None:
        every partition held, by every live scheduler (at least `schedulers`), each with its
        share. Until then a job due soon may wait for a partition's first owner or hand-over."""
        if self.held < PARTITION_COUNT:
            return f"{PARTITION_COUNT - self.held} of {PARTITION_COUNT} partitions have no scheduler yet"
        live = max(self.live, schedulers)
        if self.holders < live or self.fewest < PARTITION_COUNT // live:
            return f"{live - self.holders} of {live} schedulers have not taken their share of the partitions yet"
        return None


async def partition_ownership(conn: AsyncConnection) -> Ownership:
    row = (await conn.execute(_OWNERSHIP)).one()
    return Ownership(int(row.held), int(row.live), int(row.holders), int(row.fewest))
