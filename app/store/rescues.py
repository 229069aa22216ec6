"""Jobs, the reaper's side of a lease: find the running jobs whose lease expired or whose
lease owner is a dead replica, and lock them for the reaper to rescue (app/services/reaper.py
decides what becomes of each; outcomes.py writes it).

An open asynchronous attempt (app/domain/completion.py) is held by no replica: only its own
deadlines (the lease's expiry) end it.

A replica's death is certain when its heartbeat and partition leases have expired (so it
trusts nothing and starts no POST, app/services/ownership.py) and either
- its process is gone: none of its sessions is left on the server (each replica names its
  sessions `replica_session_name(id)`; a killed process's sockets close with it), on the
  same server instance its last heartbeat was written on (a restart or a failover ends
  every session, and proves nothing); its jobs are rescued at once. `fast` False (behind a
  transaction-mode pooler, where sessions do not belong to processes) turns this off; or
- the POST it may have started before its trust ended has had its target's timeout plus
  the lease margin to end and be recorded (its sessions are still there: it is stalled,
  overloaded or cut off, not dead).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import hashlib
from typing import Any

from sqlalchemy import Boolean, Double, Integer, Text, bindparam, column, func, literal, select, table

from app.db.async_engine import AsyncConnection
from app.domain.completion import ASYNC_OWNER
from app.domain.job import ClaimedJob
from app.domain.states import JobState
from app.keyring import KeyRing
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


def _lapsed_replicas() -> Any:
    """Replicas whose heartbeat and partition leases have expired, each with whether its
    process is gone; computed once per statement (MATERIALIZED), not once per running job."""
    live_lease = select(partition_leases.c.partition).where(
        partition_leases.c.owner == replicas.c.id, partition_leases.c.expires_at > func.now()
    )
    # One scan of the server's sessions (a hashed subplan), whatever the number of replicas.
    named = _pg_stat_activity.c.application_name
    sessions = select(named).where(named.like(_SESSION_PREFIX + "%"))
    # The UTF-8 bytes, as Python hashes them, whatever the database's encoding.
    session_name = literal(_SESSION_PREFIX) + func.left(
        func.md5(func.convert_to(replicas.c.id, "UTF8")), _SESSION_HASH_CHARS
    )
    process_gone = (
        bindparam("fast", type_=Boolean)
        & (replicas.c.server_started_at == func.pg_postmaster_start_time())
        & session_name.not_in(sessions)
    )
    return (
        select(replicas.c.id, replicas.c.expires_at, process_gone.label("process_gone"))
        .where(replicas.c.expires_at < func.now(), ~live_lease.exists())
        .cte("lapsed_replicas")
        .prefix_with("MATERIALIZED")
    )


@functools.cache
def _lock_expired_statement() -> Any:
    lapsed = _lapsed_replicas()
    in_flight_bound = func.make_interval(0, 0, 0, 0, 0, 0, targets.c.timeout_s + bindparam("margin_s", type_=Double))
    owner_dead = (
        select(lapsed.c.id)
        .where(
            lapsed.c.id == jobs.c.lease_owner,
            lapsed.c.process_gone | (lapsed.c.expires_at + in_flight_bound < func.now()),
        )
        .exists()
    )
    expired = jobs.c.lease_expires_at < func.now()
    return (
        select(
            *CLAIMED_JOB_COLUMNS,
            (~expired).label("owner_dead"),
            # Open async attempts (lease owner ASYNC_OWNER): which deadline passed, and since when.
            (jobs.c.async_deadline_at <= func.now()).label("async_deadline_passed"),
            jobs.c.awaiting_since,
        )
        .join(targets, targets.c.id == jobs.c.target_id)
        .where(jobs.c.state == JobState.RUNNING, expired | owner_dead)
        .order_by(jobs.c.lease_expires_at)
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(skip_locked=True, of=jobs)
    )


@dataclasses.dataclass(frozen=True)
class ExpiredLease:
    job: ClaimedJob
    # True: rescued because its replica is dead, before the job lease itself expired.
    owner_dead: bool
    # An open async attempt: whether its deadline passed (else its heartbeat deadline did),
    # and when it started; None for a scheduler's lease.
    async_deadline_passed: bool | None = None
    awaiting_since: dt.datetime | None = None

    @property
    def async_open(self) -> bool:
        return self.job.lease_owner == ASYNC_OWNER


async def job_lock_expired_leases(
    conn: AsyncConnection,
    key_ring: KeyRing,
    limit: int,
    margin_s: float = default_of("lease_margin_s"),
    fast: bool = default_of("dead_replica_fast_rescue"),
) -> list[ExpiredLease]:
    """Running jobs whose lease has expired, or whose lease owner is a dead replica (see the
    module docstring; `margin_s`: the time to record an outcome), row-locked for this
    transaction.

    SKIP LOCKED: two reapers never hold the same job; the lease-token guard in
    job_finish_attempts makes a late scheduler's completion a no-op.
    """
    params = {"margin_s": margin_s, "fast": fast, "limit": limit}
    rows = (await conn.execute(_lock_expired_statement(), params)).mappings().all()
    return [
        ExpiredLease(
            claimed_from_row(row, key_ring),
            bool(row["owner_dead"]),
            row["async_deadline_passed"],
            row["awaiting_since"],
        )
        for row in rows
    ]
