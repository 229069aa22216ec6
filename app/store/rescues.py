"""Jobs, the reaper's side of a lease: find the running jobs whose lease expired or whose
lease owner is a dead replica, and lock them for the reaper to rescue (app/services/reaper.py
decides what becomes of each; outcomes.py writes it).

A replica's death is certain when its heartbeat and partition leases have expired (so it
trusts nothing and starts no POST, app/services/ownership.py) and either
- its process is gone: none of its sessions is left on the server (each replica names its
  sessions `replica_session_name(id)`; a killed process's sockets close with it), and the
  server has not restarted since its last heartbeat (a restart ends every session); its jobs
  are rescued at once; or
- its sessions are still there (stalled, overloaded, cut off, or behind a pooler that hides
  them) but the POST it may have started before its trust ended has had its target's
  timeout plus the lease margin to end and be recorded.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

from sqlalchemy import Double, Text, bindparam, column, func, literal, select, table
from sqlalchemy.ext.asyncio import AsyncConnection

from app.domain.job import ClaimedJob
from app.domain.states import JobState
from app.settings import default_of
from app.store.job_rows import CLAIMED_JOB_COLUMNS, claimed_from_row
from app.store.tables import jobs, partition_leases, replicas, targets

_SESSION_PREFIX = "cronhook/"
_SESSION_HASH_CHARS = 20
# The server's view of its sessions (readable by every role: application_name is among the
# columns shown for other roles' sessions too).
_pg_stat_activity = table("pg_stat_activity", column("application_name", Text))


def replica_session_name(replica_id: str) -> str:
    """The application_name of a replica's database sessions: a hash of its id, so any id
    fits PostgreSQL's 63 bytes (and its ASCII-only rule) the same way in Python and in SQL."""
    digest = hashlib.md5(replica_id.encode(), usedforsecurity=False).hexdigest()
    return _SESSION_PREFIX + digest[:_SESSION_HASH_CHARS]


def _process_gone() -> Any:
    """The job's lease owner has no session left on a server that has been up since its
    last heartbeat."""
    name = literal(_SESSION_PREFIX) + func.left(func.md5(replicas.c.id), _SESSION_HASH_CHARS)
    session = select(_pg_stat_activity.c.application_name).where(_pg_stat_activity.c.application_name == name)
    return ~session.exists() & (func.pg_postmaster_start_time() < replicas.c.heartbeat_at)


def _owner_dead() -> Any:
    """The job's lease owner is a replica whose death is certain (see the module docstring;
    `margin_s`: the time to record an outcome). A replica that is only slow (overloaded, or
    cut off from the database for a while) keeps its in-flight deliveries."""
    live_lease = select(partition_leases.c.partition).where(
        partition_leases.c.owner == replicas.c.id, partition_leases.c.expires_at > func.now()
    )
    in_flight_bound = func.make_interval(0, 0, 0, 0, 0, 0, targets.c.timeout_s + bindparam("margin_s", type_=Double))
    return (
        select(replicas.c.id)
        .where(
            replicas.c.id == jobs.c.lease_owner,
            replicas.c.expires_at < func.now(),
            ~live_lease.exists(),
            _process_gone() | (replicas.c.expires_at + in_flight_bound < func.now()),
        )
        .exists()
    )


@dataclasses.dataclass(frozen=True)
class ExpiredLease:
    job: ClaimedJob
    # True: rescued because its replica is dead, before the job lease itself expired.
    owner_dead: bool


async def job_lock_expired_leases(
    conn: AsyncConnection, limit: int, margin_s: float = default_of("lease_margin_s")
) -> list[ExpiredLease]:
    """Running jobs whose lease has expired, or whose lease owner is a dead replica (see
    _owner_dead; `margin_s`: the time to record an outcome), row-locked for this transaction.

    SKIP LOCKED: two reapers never hold the same job; the lease-token guard in
    job_finish_attempts makes a late scheduler's completion a no-op.
    """
    expired = jobs.c.lease_expires_at < func.now()
    stmt = (
        select(*CLAIMED_JOB_COLUMNS, (~expired).label("owner_dead"))
        .join(targets, targets.c.id == jobs.c.target_id)
        .where(jobs.c.state == JobState.RUNNING, expired | _owner_dead())
        .order_by(jobs.c.lease_expires_at)
        .limit(limit)
        .with_for_update(skip_locked=True, of=jobs)
    )
    rows = (await conn.execute(stmt, {"margin_s": margin_s})).mappings().all()
    return [ExpiredLease(claimed_from_row(row), bool(row["owner_dead"])) for row in rows]
