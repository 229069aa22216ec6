"""Jobs, the scheduler's and reaper's side of a lease: claim due jobs, quarantine a row that
cannot be loaded, hand an unstarted claim back, hand an occurrence off to a child job,
and settle a misfire. Outcomes are in outcomes.py; the reaper's side (expired leases, dead
replicas) is in rescues.py.

Every write on behalf of a claim is guarded by the lease (state running and the lease
token). A statement that matches no row lost a race: the caller logs it and moves on,
never retries it blindly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import functools
import logging
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Double,
    SmallInteger,
    Text,
    bindparam,
    case,
    cast,
    func,
    literal_column,
    select,
    text,
    true,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, UUID
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import Grouping

from app.db.driver import DriverStatement, driver_fetch_all, in_autocommit
from app.db.engine import GENERIC_PLANS
from app.domain.fair_share import ClaimShares
from app.domain.job import ClaimedJob
from app.domain.partition import PARTITION_COUNT
from app.domain.priority import MAX_PRIORITY, MIN_PRIORITY
from app.domain.states import CLAIMABLE_STATES, JobState
from app.logs import log_event
from app.settings import default_of
from app.store.claim_ranking import candidate_scans, fair_ranking, share_params
from app.store.job_rows import CLAIMED_JOB_COLUMNS, claimed_from_row
from app.store.lease_writes import job_quarantine
from app.store.tables import int_constant, jobs, partition_leases, state_in, targets
from app.store.targets import target_saturated_ids, target_take_delivery_slots

logger = logging.getLogger(__name__)


def _owned_partitions() -> Any:
    """The partitions still owned by `owner` under the epochs held, as one array (an
    initplan): one pass over the lease table's few pages. The held epochs travel as one array
    indexed by partition (NULL where not held), not as pairs to join: the planner joined 256
    pairs to 256 rows by nested loop (9 ms a claim). (As array text, cast by the server: see
    held_partition_params.)"""
    # The cast as its own scalar subquery (an initplan): written inline, a generic plan
    # parsed the 256-element array text once per lease row (2 ms of every claim).
    epochs = select(cast(bindparam("epoch_by_partition", type_=Text), ARRAY(BigInteger))).scalar_subquery()
    epoch_held = func.coalesce(Grouping(epochs)[partition_leases.c.partition + 1], -1)
    owned = (
        select(func.array_agg(partition_leases.c.partition))
        .where(
            partition_leases.c.owner == bindparam("owner", type_=Text),
            partition_leases.c.expires_at > func.now(),
            partition_leases.c.epoch == epoch_held,
        )
        .scalar_subquery()
    )
    # The cast makes ANY take the array, not the subquery's rows.
    return cast(owned, ARRAY(SmallInteger))


@functools.cache
def _claim_statement(fenced: bool, skipping_full: bool) -> DriverStatement:
    """The claim, built once per (fencing, skipping full tenants/targets) with bind
    parameters and compiled once for the driver (app/db/driver.py), so asyncpg's prepared
    statement is reused by every poll.

    One statement: the level scans lock candidates, `due` ranks them within the fair shares
    (app/store/claim_ranking.py), `claimed` leases the ones whose target has no delivery
    limit and returns them, and the result lists every ranked candidate (leased or not) in
    claim order. Candidates of a limited target come back unleased, for the caller to take
    delivery slots and lease them by id.
    """
    saturated = target_saturated_ids().cte("saturated")
    conditions = [
        state_in(CLAIMABLE_STATES),
        jobs.c.run_at <= func.now(),
        # A target at its limit does not crowd the batch: its jobs wait, others go ahead.
        jobs.c.target_id.not_in(select(saturated.c.id)),
    ]
    if fenced:
        # `partition + 0`: a filter on the level scans of ix_jobs_due (in due order, stopping
        # at `limit`), never an index condition. Driven by ix_jobs_partition_due instead, a
        # scan reads and sorts every due job of the held partitions before taking `limit`:
        # a claim's cost would grow with the backlog (33 ms for 20,000 due jobs, 6 ms now).
        conditions.append((jobs.c.partition + literal_column("0::smallint")) == func.any(_owned_partitions()))
    # Candidates not taken stay locked only until this transaction (in autocommit: this
    # statement) ends.
    due = fair_ranking(candidate_scans(conditions, skipping_full))
    unlimited_ids = select(func.array_agg(due.c.id)).where(due.c.limited.is_(False))
    claimed = (
        update(jobs)
        .values(**_lease_values())
        # An array of ids (one initplan): the planner probes the primary key for each, where
        # a join on the CTE could pick a scan of the whole table.
        .where(
            jobs.c.id == func.any(cast(unlimited_ids.scalar_subquery(), ARRAY(UUID(as_uuid=True)))),
            targets.c.id == jobs.c.target_id,
        )
        .returning(*CLAIMED_JOB_COLUMNS)
        .cte("claimed")
    )
    # One row even when nothing is due: the database's clock and the next due time.
    probe = select(func.now().label("db_now"), _next_due_at(fenced).label("next_due_at")).subquery("probe")
    claim = (
        select(
            *claimed.c,
            due.c.id.label("candidate_id"),
            due.c.target_id.label("candidate_target_id"),
            due.c.limited.label("candidate_limited"),
            probe.c.db_now,
            probe.c.next_due_at,
        )
        .select_from(probe.outerjoin(due.outerjoin(claimed, claimed.c.id == due.c.id), true()))
        .order_by(due.c.rank)
    )
    return DriverStatement(claim)


def _lease_values() -> dict[str, Any]:
    """What leasing a claimable job writes (owner and lease length are bind parameters)."""
    lease = func.make_interval(0, 0, 0, 0, 0, 0, bindparam("lease_s", type_=Double))
    return {
        "state": JobState.RUNNING,
        "attempt": jobs.c.attempt + 1,
        # Kept across the occurrence's retries (attempt is 0 only before its first claim).
        "occurrence_claimed_at": case((jobs.c.attempt == 0, func.now()), else_=jobs.c.occurrence_claimed_at),
        "lease_owner": bindparam("owner", type_=Text),
        "lease_token": func.gen_random_uuid(),
        "lease_expires_at": func.now() + lease,
        "run_at": None,
        "updated_at": func.now(),
    }


def _limited_conditions(fenced: bool) -> list[ColumnElement[bool]]:
    """The candidates of limited targets (`ids`) that are still claimable: waiting, due, and
    (fenced) in a partition still held. Checked again because in autocommit the claim
    statement's row locks are gone: another replica may have delivered one meanwhile and put
    it back to wait for its retry, or a user may have rescheduled it."""
    conditions = [
        jobs.c.id == func.any(bindparam("ids", type_=ARRAY(UUID(as_uuid=True)))),
        state_in(CLAIMABLE_STATES),
        jobs.c.run_at <= func.now(),
    ]
    if fenced:
        conditions.append(jobs.c.partition == func.any(_owned_partitions()))
    return conditions


@functools.cache
def _lock_limited_statement(fenced: bool) -> Any:
    """Locks the limited candidates still claimable, for the slots and the lease that follow
    in the same transaction."""
    return (
        select(jobs.c.id, jobs.c.target_id)
        .where(*_limited_conditions(fenced))
        .with_for_update(skip_locked=True, of=jobs)
    )


@functools.cache
def _claim_limited_statement(fenced: bool) -> Any:
    """Leases the candidates of limited targets that got delivery slots (row-locked by this
    transaction)."""
    return (
        update(jobs)
        .values(**_lease_values())
        .where(*_limited_conditions(fenced), targets.c.id == jobs.c.target_id)
        .returning(*CLAIMED_JOB_COLUMNS)
    )


# The scheduler's claim runs on its cached generic plan (index probes in due order, stopping
# at `limit`). PostgreSQL would plan it afresh on every poll, because with a large table it
# overestimates the generic plan (a `limit` it cannot see), though the plans are the same:
# 4-7 ms of planning per claim, against 0.4 ms to run an idle claim. A round trip is cheaper.
# (Not the claim that skips full tenants: its generic plan is worse, and it is rare.)
_GENERIC_PLAN = text("SET LOCAL plan_cache_mode = force_generic_plan")
_CUSTOM_PLANS = text("SET LOCAL plan_cache_mode = auto")


def epochs_by_partition(held: dict[int, int]) -> list[int | None]:
    """The held epochs as the claim takes them: element `partition` is its epoch, None
    where the partition is not held."""
    epochs: list[int | None] = [None] * PARTITION_COUNT
    for partition, epoch in held.items():
        epochs[partition] = epoch
    return epochs


@functools.lru_cache(maxsize=8)
def _held_partition_text(held: tuple[tuple[int, int], ...]) -> tuple[str, str]:
    epochs = epochs_by_partition(dict(held))
    partitions = "{" + ",".join(str(partition) for partition, _ in held) + "}"
    return partitions, "{" + ",".join("NULL" if epoch is None else str(epoch) for epoch in epochs) + "}"


def held_partition_params(held: dict[int, int]) -> dict[str, str]:
    """The claim's `partitions` and `epoch_by_partition`, as PostgreSQL array text. Sent as
    arrays, their 512 elements cost asyncpg an encoding and an isinstance check each, on
    every claim (a third of a small claim's client CPU); as text they are one string the
    server parses, and the same held partitions give the same strings (cached)."""
    partitions, epochs = _held_partition_text(tuple(held.items()))
    return {"partitions": partitions, "epoch_by_partition": epochs}


@dataclasses.dataclass(frozen=True)
class ClaimBatch:
    jobs: list[ClaimedJob]
    # The database's now() and the earliest run_at still ahead in the claimed-from
    # partitions (None: nothing waits): when to look again after draining what is due.
    db_now: dt.datetime
    next_due_at: dt.datetime | None


async def job_claim_due(
    conn: AsyncConnection, owner: str, limit: int, lease_s: float, held: dict[int, int] | None = None
) -> list[ClaimedJob]:
    """job_claim_batch's jobs, with the default aging and no shares (none when `held` is
    empty): the claim as tools and tests take it."""
    if held is not None and not held:
        return []
    return (await job_claim_batch(conn, owner, limit, lease_s, held)).jobs


async def job_claim_batch(
    conn: AsyncConnection,
    owner: str,
    limit: int,
    lease_s: float,
    held: dict[int, int] | None = None,
    aging_s: float = default_of("priority_aging_s"),
    shares: ClaimShares | None = None,
) -> ClaimBatch:
    """Leases up to `limit` due jobs to `owner`, highest effective priority first (priority
    plus one level per `aging_s` waited), then oldest due first, each tenant and each target
    without a max_in_flight of its own within its free share of `shares` (None: no shares).

    `held` (partition -> epoch) fences the claim by ownership: only jobs in partitions whose
    lease row still names `owner` with that epoch, unexpired, are taken. None claims from
    every partition (tools and tests that run without ownership). SKIP LOCKED lets
    concurrent schedulers claim disjoint batches without waiting.
    """
    if held is not None and not held:
        raise ValueError("held names no partition: nothing may be claimed")
    params: dict[str, Any] = {"owner": owner, "limit": limit, "lease_s": lease_s, "aging_s": aging_s}
    params.update(share_params(shares, limit))
    skipping_full = bool(params["full_tenants"] or params["full_targets"])
    if held is not None:
        params.update(held_partition_params(held))
    statement = _claim_statement(held is not None, skipping_full)
    plan_setting = _plan_setting(conn, skipping_full) if held is not None else None
    if plan_setting is None:
        # In autocommit (the scheduler's), one round trip on the driver: no BEGIN, no COMMIT,
        # none of SQLAlchemy's execution around 100 rows (app/db/driver.py).
        rows = await _claim_rows(conn, statement, params, owner, lease_s)
    else:
        async with _transaction(conn):  # SET LOCAL holds for the claim's transaction only
            await conn.execute(plan_setting)
            rows = await _claim_rows(conn, statement, params, owner, lease_s)
    db_now, next_due_at = rows.db_now, rows.next_due_at
    claimed: list[ClaimedJob] = []
    for row in rows.leased:
        try:
            claimed.append(claimed_from_row(row))
        except Exception as exc:  # one row that cannot be loaded must not stop every delivery
            await job_quarantine(conn, row["id"], row["lease_token"], f"{type(exc).__name__}: {exc}"[:300])
    return ClaimBatch(claimed, db_now, next_due_at)


def _plan_setting(conn: AsyncConnection, skipping_full: bool) -> Any:
    """The plan cache mode the fenced claim needs, when the session's is not it (None: it is).
    A scheduler's sessions run on generic plans (no round trip)."""
    sync = conn.sync_connection
    generic_session = sync is not None and sync.get_execution_options().get(GENERIC_PLANS, False)
    if not skipping_full and not generic_session:
        return _GENERIC_PLAN
    if skipping_full and generic_session:
        return _CUSTOM_PLANS
    return None


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
    values = {"ids": [row["candidate_id"] for row in limited_rows], "owner": owner, "lease_s": lease_s}
    if fenced:
        values["epoch_by_partition"] = params["epoch_by_partition"]
    async with _transaction(conn):
        still = set((await conn.execute(_lock_limited_statement(fenced), values)).scalars())
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
        more = await conn.execute(_claim_limited_statement(fenced), {**values, "ids": ids})
        return list(more.mappings().all())


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


def _next_due_at(fenced: bool) -> Any:
    """The earliest run_at still ahead among waiting jobs (in the held partitions when
    fenced): one short index probe per priority level (ix_jobs_due), however large the table."""
    partition_held = jobs.c.partition == func.any(cast(bindparam("partitions", type_=Text), ARRAY(SmallInteger)))
    firsts = [
        select(jobs.c.run_at)
        .where(
            state_in(CLAIMABLE_STATES),
            jobs.c.priority == int_constant(level),
            jobs.c.run_at > func.now(),
            *([partition_held] if fenced else []),
        )
        .order_by(jobs.c.run_at)
        .limit(1)
        .scalar_subquery()
        for level in range(MIN_PRIORITY, MAX_PRIORITY + 1)
    ]
    return func.least(*firsts)
