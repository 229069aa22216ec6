"""Jobs, claiming: running the claim's statements (app/store/claim_statements.py) in
autocommit or in a transaction, on the plan cache mode they need, and leasing the candidates
of limited targets as far as their delivery slots allow. What is then written on behalf of a
claim is lease_writes.py's; outcomes are outcomes.py's; the reaper's side (expired leases,
dead replicas) is rescues.py's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import logging
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

from sqlalchemy import text

from app.db.async_engine import AsyncConnection
from app.db.driver import DriverStatement, driver_fetch_all, in_autocommit
from app.db.engine import GENERIC_PLANS
from app.domain.fair_share import ClaimShares
from app.domain.job import ClaimedJob
from app.keyring import KeyRing
from app.logs import log_event
from app.settings import default_of
from app.store.claim_params import held_partition_params, share_params
from app.store.claim_statements import claim_statement, lease_limited_statement, lock_limited_statement
from app.store.job_rows import claimed_from_row
from app.store.lease_writes import job_quarantine
from app.store.targets import target_take_delivery_slots

logger = logging.getLogger(__name__)


# The scheduler's claim runs on its cached generic plan (index probes in due order, stopping
# at `limit`). PostgreSQL would plan it afresh on every poll, because with a large table it
# overestimates the generic plan (a `limit` it cannot see), though the plans are the same:
# 4-7 ms of planning per claim, against 0.4 ms to run an idle claim. A round trip is cheaper.
# So does the claim that skips full tenants: its generic plan is its custom one (the `probe`'s
# LIMIT and held partitions are written so that it is, app/store/claim_statements.py).
_GENERIC_PLAN = text("SET LOCAL plan_cache_mode = force_generic_plan")


@dataclasses.dataclass(frozen=True)
class ClaimBatch:
    jobs: list[ClaimedJob]
    # The database's now() and the earliest run_at still ahead in the claimed-from
    # partitions (None: nothing waits): when to look again after draining what is due.
    db_now: dt.datetime
    next_due_at: dt.datetime | None
    # Local monotonic time once the answer was in hand (before its rows were decoded): after
    # every clock reading the claim returned (app/domain/db_clock.py).
    received_mono: float

    @property
    def clock_at(self) -> dt.datetime:
        """The database's clock as the claim's last row left (its start when it took nothing):
        what to plan the next wake from. From the start, the claim's own duration would come
        off every job's claim-ahead."""
        return max(job.clock_at for job in self.jobs) if self.jobs else self.db_now


async def job_claim_due(
    conn: AsyncConnection, key_ring: KeyRing, owner: str, limit: int, lease_s: float, held: dict[int, int] | None = None
) -> list[ClaimedJob]:
    """job_claim_batch's jobs, with the default aging and no shares (none when `held` is
    empty): the claim as tools and tests take it."""
    if held is not None and not held:
        return []
    return (await job_claim_batch(conn, key_ring, owner, limit, lease_s, held)).jobs


# An epoch no partition lease ever has (0 until first taken, then up by one per take): a claim
# fenced by it runs in full and takes nothing.
_NO_EPOCH = -1


async def job_claim_warm_up(
    conn: AsyncConnection, key_ring: KeyRing, owner: str, limit: int, lease_s: float, aging_s: float
) -> None:
    """Runs the claim once on `conn` without taking anything: PostgreSQL parses and plans it,
    and the driver learns its result's types, on this session, before a claim that counts.
    The first claim on a new session costs 20-100 ms, on a busy server more.

    Both variants: the one skipping full tenants and targets runs as soon as a tenant fills
    its share, which a burst of one tenant's jobs does within its first claims; compiled
    then, it cost each scheduler process ~100 ms of CPU in the middle of the burst."""
    await job_claim_batch(conn, key_ring, owner, limit, lease_s, {0: _NO_EPOCH}, aging_s)
    full = ClaimShares(tenant_free={uuid.uuid4(): 0})  # a tenant no job has, at its share
    await job_claim_batch(conn, key_ring, owner, limit, lease_s, {0: _NO_EPOCH}, aging_s, full)


async def job_claim_batch(
    conn: AsyncConnection,
    key_ring: KeyRing,
    owner: str,
    limit: int,
    lease_s: float,
    held: dict[int, int] | None = None,
    aging_s: float = default_of("priority_aging_s"),
    shares: ClaimShares | None = None,
    ahead_s: float = 0.0,
) -> ClaimBatch:
    """Leases up to `limit` due jobs to `owner`, highest effective priority first (priority
    plus one level per `aging_s` waited), then oldest due first, each tenant and each target
    without a max_in_flight of its own within its free share of `shares` (None: no shares).
    `ahead_s` > 0 also takes jobs due within that many seconds: the caller must not deliver
    one before its due time (ClaimedJob.due_at).

    `held` (partition -> epoch) fences the claim by ownership: only jobs in partitions whose
    lease row still names `owner` with that epoch, unexpired, are taken. None claims from
    every partition (tools and tests that run without ownership). SKIP LOCKED lets
    concurrent schedulers claim disjoint batches without waiting. `key_ring` opens the
    claimed jobs' target secrets.
    """
    if held is not None and not held:
        raise ValueError("held names no partition: nothing may be claimed")
    params: dict[str, Any] = {
        "owner": owner,
        "limit": limit,
        "lease_s": lease_s,
        "aging_s": aging_s,
        "ahead_s": ahead_s,
    }
    params.update(share_params(shares, limit))
    skipping_full = bool(params["full_tenants"] or params["full_targets"])
    if held is not None:
        params.update(held_partition_params(held))
    statement = claim_statement(held is not None, skipping_full)
    plan_setting = _plan_setting(conn) if held is not None else None
    if plan_setting is None:
        # In autocommit (the scheduler's), one round trip on the driver: no BEGIN, no COMMIT,
        # none of SQLAlchemy's execution around 100 rows (app/db/driver.py).
        rows = await _claim_rows(conn, statement, params, owner, lease_s)
    else:
        async with _transaction(conn):  # SET LOCAL holds for the claim's transaction only
            await conn.execute(plan_setting)
            rows = await _claim_rows(conn, statement, params, owner, lease_s)
    received_mono = time.monotonic()
    db_now, next_due_at = rows.db_now, rows.next_due_at
    claimed: list[ClaimedJob] = []
    for row in rows.leased:
        try:
            claimed.append(claimed_from_row(row, key_ring))
        except Exception as exc:  # one row that cannot be loaded must not stop every delivery
            await job_quarantine(conn, row["id"], row["lease_token"], f"{type(exc).__name__}: {exc}"[:300])
    return ClaimBatch(claimed, db_now, next_due_at, received_mono)


def _plan_setting(conn: AsyncConnection) -> Any:
    """The plan cache mode the fenced claim needs (either variant), when the session's is not
    it (None: it is). A scheduler's sessions run on generic plans (no round trip)."""
    sync = conn.sync_connection
    generic_session = sync is not None and sync.get_execution_options().get(GENERIC_PLANS, False)
    return None if generic_session else _GENERIC_PLAN


@dataclasses.dataclass(frozen=True)
class _ClaimRows:
    # The driver's rows (dicts), or SQLAlchemy's (RowMapping) inside a caller's transaction.
    leased: list[Any]
    db_now: dt.datetime
    next_due_at: dt.datetime | None


async def _claim_rows(
    conn: AsyncConnection, statement: DriverStatement, params: dict[str, Any], owner: str, lease_s: float
) -> _ClaimRows:
    """The claim statement's leased rows, and the candidates of limited targets leased as far
    as their delivery slots allow."""
    rows = await driver_fetch_all(conn, statement, params)
    leased: list[Any] = [row for row in rows if row["id"] is not None]
    limited_rows = [row for row in rows if row["candidate_limited"]]
    if limited_rows:
        autocommit = in_autocommit(conn)
        try:
            leased.extend(await _lease_limited(conn, limited_rows, params, owner, lease_s))
        except Exception as exc:
            if not autocommit:
                raise
            # The unlimited jobs are leased and committed already: deliver them rather than
            # leave their leases to expire (the reaper would count an attempt never made).
            log_event(logger, "claim_limited_failed", logging.WARNING, error=type(exc).__name__)
    return _ClaimRows(leased, rows[0]["db_now"], rows[0]["next_due_at"])


async def _lease_limited(
    conn: AsyncConnection, limited_rows: list[Any], params: dict[str, Any], owner: str, lease_s: float
) -> list[Any]:
    """Takes delivery slots for the limited targets' candidates and leases the granted ones,
    in one transaction (the caller's, or one of its own on an autocommit connection, where
    the claim statement's row locks are gone: the candidates are locked again, each checked
    to be still waiting, due and held)."""
    fenced = "epoch_by_partition" in params
    values = {
        "ids": [row["candidate_id"] for row in limited_rows],
        "owner": owner,
        "lease_s": lease_s,
        "ahead_s": params.get("ahead_s", 0.0),
    }
    if fenced:
        values["epoch_by_partition"] = params["epoch_by_partition"]
    async with _transaction(conn):
        locked = await conn.execute(lock_limited_statement(fenced), values)
        still = {row.id: row.run_at for row in locked}
        candidates = [row for row in limited_rows if row["candidate_id"] in still]
        if not candidates:
            return []
        granted = await target_take_delivery_slots(conn, Counter(row["candidate_target_id"] for row in candidates))
        ids = []
        for row in candidates:  # in claim order: each limited target keeps its best jobs
            if granted[row["candidate_target_id"]] > 0:
                granted[row["candidate_target_id"]] -= 1
                ids.append(row["candidate_id"])
        if not ids:
            return []
        more = await conn.execute(lease_limited_statement(fenced), {**values, "ids": ids})
        # With the run_at each was due at, as the claim statement's own rows have it.
        return [{**row, "candidate_run_at": still[row["id"]]} for row in more.mappings()]


@contextlib.asynccontextmanager
async def _transaction(conn: AsyncConnection) -> AsyncIterator[None]:
    """A transaction for the block: the caller's, or on an autocommit connection one of its
    own (committed at the end, rolled back on an error), after which it is autocommit again."""
    if not in_autocommit(conn):
        yield
        return
    await conn.execution_options(isolation_level="READ COMMITTED")
    try:
        async with conn.begin():
            yield
    finally:
        sync = conn.sync_connection
        # An invalidated connection (dead, or cancelled mid-statement) is not set back: that
        # would check out a new one, and the pool resets the level on return anyway.
        if sync is not None and not sync.closed and not sync.invalidated:
            await conn.execution_options(isolation_level="AUTOCOMMIT")
