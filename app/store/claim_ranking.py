"""The claim statement's candidate scans and ranking (app/store/claims.py builds the rest):
priority with aging, and the fair shares of app/domain/fair_share.py applied as bind
parameters, so the statement is still built once.

Each priority level contributes its `limit` oldest due jobs. Within one level the longest
waiting job has the highest effective priority, so the `limit` best jobs overall are among
those candidates. Then each target without a max_in_flight of its own keeps at most its
free slots (its best jobs), each tenant keeps at most its free share, and the best `limit`
of what is left are the batch.

While some tenant or target is at its share, the scans go tenant by tenant instead
(ix_jobs_tenant_due) and leave the full ones out, or a full tenant's backlog of older jobs
would fill every level's candidates and hide the others' jobs: one short probe per tenant
and level, however deep that backlog is.
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Double,
    Integer,
    all_,
    bindparam,
    case,
    column,
    func,
    select,
    true,
    union_all,
)
from sqlalchemy.dialects.postgresql import ARRAY, UUID

from app.domain.fair_share import ClaimShares
from app.domain.priority import MAX_PRIORITY, MIN_PRIORITY
from app.store.tables import int_constant, jobs, targets, tenants

# The most tenants one claim that skips full tenants looks at (the next claim starts at
# another one).
TENANT_PAGE = 200

_UUIDS = ARRAY(UUID(as_uuid=True))


def candidate_scans(conditions: list[ColumnElement[bool]], skipping_full: bool) -> Any:
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


def fair_ranking(candidates: Any) -> Any:
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
            func.row_number().over(order_by=order).label("rank"),
        )
        .where(by_tenant.c.tenant_rank <= by_tenant.c.tenant_free)
        .order_by(*order)
        .limit(bindparam("limit", type_=Integer))
        .cte("due")
    )


def share_params(shares: ClaimShares | None, limit: int) -> dict[str, Any]:
    """The claim's fair-share bind parameters (None: no shares, for tools and tests)."""
    shares = shares or ClaimShares(tenant_share=limit, target_cap=limit)
    return {
        "tenant_ids": list(shares.tenant_free),
        "tenant_free": list(shares.tenant_free.values()),
        "tenant_share": shares.tenant_share,
        "target_ids": list(shares.target_free),
        "target_free": list(shares.target_free.values()),
        "target_cap": shares.target_cap,
        "full_tenants": shares.full_tenants,
        "full_targets": shares.full_targets,
        "tenant_page": TENANT_PAGE,
        "tenant_after": uuid.uuid4(),
    }
