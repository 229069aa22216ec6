"""The database's health as the service sees it: a commit probe, this process's sessions'
waits (for a stall warning), and whether any scheduler of the cluster is alive. Used by
app/services/db_health.py; none of it is on a hot path."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import Double, Text, column, func, select, table, text
from sqlalchemy.ext.asyncio import AsyncConnection

from app.store.tables import replicas

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
