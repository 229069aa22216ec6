"""Jobs, the reaper's side of a lease: find the running jobs whose lease expired or whose
lease owner is a dead replica, and lock them for the reaper to rescue (app/services/reaper.py
decides what becomes of each; outcomes.py writes it).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sqlalchemy import Double, bindparam, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from app.domain.job import ClaimedJob
from app.domain.states import JobState
from app.settings import default_of
from app.store.job_rows import CLAIMED_JOB_COLUMNS, claimed_from_row
from app.store.tables import jobs, partition_leases, replicas, targets


def _owner_dead() -> Any:
    """The job's lease owner is a replica whose death is certain: its heartbeat expired, it
    holds no live partition lease (so it trusts none and starts no POST, see
    app/services/ownership.py), and the POST it may have started before that has had its
    target's timeout plus `margin_s` to end and be recorded. A replica that is only slow
    (overloaded, or cut off from the database for a while) keeps its in-flight deliveries."""
    live_lease = select(partition_leases.c.partition).where(
        partition_leases.c.owner == replicas.c.id, partition_leases.c.expires_at > func.now()
    )
    in_flight_bound = func.make_interval(0, 0, 0, 0, 0, 0, targets.c.timeout_s + bindparam("margin_s", type_=Double))
    return (
        select(replicas.c.id)
        .where(
            replicas.c.id == jobs.c.lease_owner,
            replicas.c.expires_at + in_flight_bound < func.now(),
            ~live_lease.exists(),
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
