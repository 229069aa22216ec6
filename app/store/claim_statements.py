"""The claim's statements, each built once per variant (app/store/claims.py runs them, with
the bind parameters of app/store/claim_params.py). Rendered for reading in app/store/sql/
(job_claim_due.sql...).

One statement claims a batch: the candidate scans lock due jobs with SKIP LOCKED, the
ranking keeps each within its fair share, the jobs of targets without a delivery limit are
leased, and the result lists every ranked candidate. Limited targets' candidates are leased
by two more statements once their delivery slots are taken.

Ranking: each priority level contributes its `limit` oldest due jobs. Within one level the
longest waiting job has the highest effective priority (priority plus one level per
`aging_s` waited), so the `limit` best jobs overall are among those candidates. Then each
target without a max_in_flight of its own keeps at most its free slots (its best jobs), each
tenant keeps at most its free share (app/domain/fair_share.py, as bind parameters, so the
statement is still built once), and the best `limit` of what is left are the batch.

While some tenant or target is at its share, the scans go tenant by tenant instead
(ix_jobs_tenant_due) and leave the full ones out, or a full tenant's backlog of older jobs
would fill every level's candidates and hide the others' jobs: one short probe per tenant
and level, however deep that backlog is.
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Double,
    Integer,
    SmallInteger,
    Text,
    all_,
    bindparam,
    case,
    cast,
    column,
    func,
    literal_column,
    select,
    true,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, UUID
from sqlalchemy.sql.elements import Grouping

from app.db.driver import DriverStatement
from app.domain.priority import MAX_PRIORITY, MIN_PRIORITY
from app.domain.states import CLAIMABLE_STATES, JobState
from app.store.job_rows import CLAIMED_JOB_COLUMNS, HELD, SENT_AT
from app.store.tables import int_constant, jobs, partition_leases, state_in, targets, tenants
from app.store.targets import target_saturated_ids

_UUIDS = ARRAY(UUID(as_uuid=True))


@functools.cache
def claim_statement(fenced: bool, skipping_full: bool) -> DriverStatement:
    """The claim, built once per (fencing, skipping full tenants/targets) with bind
    parameters and compiled once for the driver (app/db/driver.py), so asyncpg's prepared
    statement is reused by every poll.

    One statement: the level scans lock candidates, `due` ranks them within the fair shares
    (_fair_ranking), `claimed` leases the ones whose target has no delivery
    limit and returns them, and the result lists every ranked candidate (leased or not) in
    claim order. Candidates of a limited target come back unleased, for the caller to take
    delivery slots and lease them by id.
    """
    saturated = target_saturated_ids().cte("saturated")
    conditions = [
        state_in(CLAIMABLE_STATES),
        jobs.c.run_at <= _claim_horizon(),
        # A target at its limit does not crowd the batch: its jobs wait, others go ahead. A
        # paused one's (or its tenant's) wait for the resume: the reaper holds them soon
        # (app/services/hold_watch.py), so that no scan walks past them.
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
    due = _fair_ranking(_candidate_scans(conditions, skipping_full))
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
    probe = next_due_statement(fenced).subquery("probe")
    claim = (
        select(
            *claimed.c,
            due.c.id.label("candidate_id"),
            due.c.target_id.label("candidate_target_id"),
            due.c.limited.label("candidate_limited"),
            # The run_at each was due at (the lease clears it): the misfire check's due time.
            due.c.run_at.label("candidate_run_at"),
            probe.c.db_now,
            probe.c.next_due_at,
            SENT_AT,
        )
        .select_from(probe.outerjoin(due.outerjoin(claimed, claimed.c.id == due.c.id), true()))
        .order_by(due.c.rank)
    )
    return DriverStatement(claim)


def _claim_horizon() -> Any:
    """The latest run_at a claim takes: now, or `ahead_s` later. A scheduler claims the jobs
    falling due within its next ~50 ms and holds each until its due time (app/services/
    attempts.py), so the POST leaves at the due time rather than a claim's round trip after
    it; the next-due probe looks beyond the same horizon."""
    # One bind parameter times a constant interval: make_interval(0, 0, 0, 0, 0, 0, x) would
    # add six constant parameters to every scan that reads the horizon (all sent with each claim).
    return func.now() + bindparam("ahead_s", type_=Double) * literal_column("interval '1 second'")


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
        # A held_run_at left from a hold the job has moved on from (PATCHed, resumed by
        # itself) ends here: only a held occurrence carries one (app/store/pauses.py).
        "held_run_at": None,
        "updated_at": func.now(),
    }


def _candidate_scans(conditions: list[ColumnElement[bool]], skipping_full: bool) -> Any:
    """The candidates (id, tenant_id, target_id, priority, run_at), locked with SKIP LOCKED
    so concurrent claimers take disjoint ones."""
    limit = bindparam("limit", type_=Integer)
    columns = (jobs.c.id, jobs.c.tenant_id, jobs.c.target_id, jobs.c.priority, jobs.c.run_at)
    levels = range(MIN_PRIORITY, MAX_PRIORITY + 1)
    if not skipping_full:
        # One short index scan (ix_jobs_due) per level.
        scans = [
            select(*columns)
            .where(*conditions, jobs.c.priority == int_constant(level))
            .order_by(jobs.c.run_at)
            .limit(limit)
            .with_for_update(skip_locked=True, of=jobs)
            .cte(f"level_{level}")
            for level in levels
        ]
        return union_all(*(select(scan) for scan in scans)).subquery("candidates")
    # Some tenants or targets are at their share: scanning by level would walk past their
    # backlog. Instead, tenant by tenant (up to `tenant_page` of the others, starting after
    # `tenant_after`, so that with more tenants every claim starts elsewhere), one probe of
    # ix_jobs_tenant_due per level, each taking no more than the tenant's free share.
    tenant_free = _free("tenant")
    free = func.least(limit, func.coalesce(tenant_free.c.free, bindparam("tenant_share", type_=Integer)))
    page = (
        select(tenants.c.id, free.label("free"))
        .outerjoin(tenant_free, tenant_free.c.id == tenants.c.id)
        .where(tenants.c.id != all_(bindparam("full_tenants", type_=_UUIDS)))
        .order_by(tenants.c.id <= bindparam("tenant_after", type_=UUID(as_uuid=True)), tenants.c.id)
        .limit(bindparam("tenant_page", type_=Integer))
        .cte("tenant_page")
    )
    selects = []
    for level in levels:
        scan = (
            select(*columns)
            .where(
                *conditions,
                jobs.c.tenant_id == page.c.id,
                jobs.c.priority == int_constant(level),
                jobs.c.target_id != all_(bindparam("full_targets", type_=_UUIDS)),
            )
            .order_by(jobs.c.run_at)
            .limit(page.c.free)
            .with_for_update(skip_locked=True, of=jobs)
            .lateral(f"level_{level}")
        )
        selects.append(select(scan).select_from(page.join(scan, true())))
    return union_all(*selects).subquery("candidates")


def _free(name: str) -> Any:
    """(id, free) pairs from two array parameters: `<name>_ids` and `<name>_free`."""
    return (
        func.unnest(bindparam(f"{name}_ids", type_=_UUIDS), bindparam(f"{name}_free", type_=ARRAY(Integer)))
        .table_valued(column("id", UUID(as_uuid=True)), column("free", Integer))
        .render_derived(name=f"{name}_free")
    )


def _fair_ranking(candidates: Any) -> Any:
    """The batch: candidates within their target's and tenant's free shares, best first
    (effective priority, then due time), at most `limit`, with `rank` and `limited` (the
    target has max_in_flight or rate_per_s: the caller takes its delivery slots)."""
    waited_s = func.extract("epoch", func.now() - candidates.c.run_at)
    effective = candidates.c.priority + func.greatest(waited_s, 0) / bindparam("aging_s", type_=Double)
    tenant_free, target_free = _free("tenant"), _free("target")
    scored = (
        select(
            candidates.c.id,
            candidates.c.tenant_id,
            candidates.c.target_id,
            candidates.c.run_at,
            effective.label("effective"),
            (targets.c.max_in_flight.is_not(None) | targets.c.rate_per_s.is_not(None)).label("limited"),
            # An explicit max_in_flight replaces the default cap (and holds cluster-wide).
            case(
                (targets.c.max_in_flight.is_not(None), bindparam("limit", type_=Integer)),
                else_=func.coalesce(target_free.c.free, bindparam("target_cap", type_=Integer)),
            ).label("target_free"),
            func.coalesce(tenant_free.c.free, bindparam("tenant_share", type_=Integer)).label("tenant_free"),
        )
        .join(targets, targets.c.id == candidates.c.target_id)
        .outerjoin(target_free, target_free.c.id == candidates.c.target_id)
        .outerjoin(tenant_free, tenant_free.c.id == candidates.c.tenant_id)
        .subquery("scored")
    )
    best_first = (scored.c.effective.desc(), scored.c.run_at)
    by_target = select(
        scored, func.row_number().over(partition_by=scored.c.target_id, order_by=best_first).label("target_rank")
    ).subquery("by_target")
    within_target = select(by_target).where(by_target.c.target_rank <= by_target.c.target_free).subquery("kept")
    order = (within_target.c.effective.desc(), within_target.c.run_at)
    by_tenant = select(
        within_target,
        func.row_number().over(partition_by=within_target.c.tenant_id, order_by=order).label("tenant_rank"),
    ).subquery("by_tenant")
    order = (by_tenant.c.effective.desc(), by_tenant.c.run_at)
    return (
        select(
            by_tenant.c.id,
            by_tenant.c.target_id,
            by_tenant.c.limited,
            by_tenant.c.run_at,
            func.row_number().over(order_by=order).label("rank"),
        )
        .where(by_tenant.c.tenant_rank <= by_tenant.c.tenant_free)
        .order_by(*order)
        .limit(bindparam("limit", type_=Integer))
        .cte("due")
    )


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


def _next_due_at(fenced: bool) -> Any:
    """The earliest run_at still ahead among waiting jobs (in the held partitions when
    fenced): one short index probe per priority level (ix_jobs_due), however large the table.
    Held occurrences (run_at HELD) are never due: a scheduler does not plan to wake for them."""
    # The held partitions' array text cast in a scalar subquery of its own (an initplan, parsed
    # once), and `partition + 0` (a filter, never an index condition, as in the claim's scans):
    # written `partition = ANY(CAST(:partitions ...))`, a generic plan parsed the 256-element
    # text again for every row, and guessing the array at 10 partitions it scanned and sorted
    # every waiting job instead of stopping at the first in due order (21 ms of an idle
    # claim at 2,700 waiting jobs, against 0.7 ms).
    held = select(cast(bindparam("partitions", type_=Text), ARRAY(SmallInteger))).scalar_subquery()
    partition_held = (jobs.c.partition + literal_column("0::smallint")) == func.any(cast(held, ARRAY(SmallInteger)))
    firsts = [
        select(jobs.c.run_at)
        .where(
            state_in(CLAIMABLE_STATES),
            jobs.c.priority == int_constant(level),
            jobs.c.run_at > _claim_horizon(),
            jobs.c.run_at < HELD,
            *([partition_held] if fenced else []),
        )
        .order_by(jobs.c.run_at)
        # A constant: a generic plan cannot see a bind parameter's 1, and expecting a tenth of
        # the rows it sorted them all rather than stop at the first in ix_jobs_due.
        .limit(int_constant(1))
        .scalar_subquery()
        for level in range(MIN_PRIORITY, MAX_PRIORITY + 1)
    ]
    return func.least(*firsts)


@functools.cache
def next_due_statement(fenced: bool) -> Any:
    """The claim's `probe`, one row even when nothing is due: the database's clock and the
    next due time (when the scheduler looks again after draining what is due)."""
    return select(func.now().label("db_now"), _next_due_at(fenced).label("next_due_at"))


def _limited_conditions(fenced: bool) -> list[ColumnElement[bool]]:
    """The candidates of limited targets (`ids`) that are still claimable: waiting, due, and
    (fenced) in a partition still held. Checked again because in autocommit the claim
    statement's row locks are gone: another replica may have delivered one meanwhile and put
    it back to wait for its retry, or a user may have rescheduled it."""
    conditions = [
        jobs.c.id == func.any(bindparam("ids", type_=ARRAY(UUID(as_uuid=True)))),
        state_in(CLAIMABLE_STATES),
        jobs.c.run_at <= _claim_horizon(),
    ]
    if fenced:
        conditions.append(jobs.c.partition == func.any(_owned_partitions()))
    return conditions


@functools.cache
def lock_limited_statement(fenced: bool) -> Any:
    """Locks the limited candidates still claimable, for the slots and the lease that follow
    in the same transaction; with the run_at each is due at (the lease clears it)."""
    return (
        select(jobs.c.id, jobs.c.target_id, jobs.c.run_at)
        .where(*_limited_conditions(fenced))
        .with_for_update(skip_locked=True, of=jobs)
    )


@functools.cache
def lease_limited_statement(fenced: bool) -> Any:
    """Leases the candidates of limited targets that got delivery slots (row-locked by this
    transaction)."""
    return (
        update(jobs)
        .values(**_lease_values())
        .where(*_limited_conditions(fenced), targets.c.id == jobs.c.target_id)
        .returning(*CLAIMED_JOB_COLUMNS, SENT_AT)
    )
