"""Per-tenant quotas: overrides, the counts they bound, and the API's shared request bucket."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import Double, bindparam, cast, func, select, text
from sqlalchemy.dialects.postgresql import UUID, insert
from sqlalchemy.engine import RowMapping

from app.db.async_engine import AsyncConnection
from app.domain.health import TENANT_DEFAULT_FIELDS
from app.domain.quotas import LIMIT_FIELDS
from app.store.tables import api_rate_buckets, tenant_limits
from app.store.targets import target_live, unfinished_jobs_count

# What a tenant_limits row holds: the quota overrides, and the tenant's schedule health
# defaults (app/domain/health.py).
STORED_FIELDS = (*LIMIT_FIELDS, *TENANT_DEFAULT_FIELDS)
# A bucket holds this many seconds' worth of requests: short bursts pass.
BURST_S = 2.0


async def tenant_limits_get(conn: AsyncConnection, tenant_id: uuid.UUID) -> dict[str, Any]:
    """The tenant's overrides and health defaults (a field absent or null: the default applies)."""
    row = (
        (
            await conn.execute(
                select(*(tenant_limits.c[name] for name in STORED_FIELDS)).where(tenant_limits.c.tenant_id == tenant_id)
            )
        )
        .mappings()
        .one_or_none()
    )
    return {} if row is None else dict(row)


async def tenant_limits_set(conn: AsyncConnection, tenant_id: uuid.UUID, overrides: dict[str, Any]) -> dict[str, Any]:
    """Sets the given overrides (None clears one back to the default); returns all of them."""
    values = {name: overrides[name] for name in STORED_FIELDS if name in overrides}
    stmt = insert(tenant_limits).values(tenant_id=tenant_id, **values)
    stmt = stmt.on_conflict_do_update(index_elements=["tenant_id"], set_={**values, "updated_at": func.now()})
    await conn.execute(stmt)
    return await tenant_limits_get(conn, tenant_id)


async def tenant_count_targets(conn: AsyncConnection, tenant_id: uuid.UUID) -> int:
    stmt = select(func.count()).where(target_live(tenant_id))
    return int(await conn.scalar(stmt) or 0)


# The tenant's pending deltas folded into its counter, which is returned: a read costs the
# deltas written since the last one (triggers on jobs append them: migrations 0023-0025), whatever
# the number of the tenant's jobs. Concurrent folds each take the rows they deleted; the
# upsert adds to the latest committed counter.
_ACTIVE_FOLD = text(
    """
WITH moved AS (
    DELETE FROM tenant_job_deltas WHERE tenant_id = :tenant_id RETURNING delta
)
INSERT INTO tenant_job_counts AS c (tenant_id, active)
SELECT :tenant_id, coalesce(sum(delta), 0) FROM moved
ON CONFLICT (tenant_id) DO UPDATE SET active = c.active + excluded.active
RETURNING active
"""
).bindparams(bindparam("tenant_id", type_=UUID(as_uuid=True)))


async def tenant_count_active_jobs(conn: AsyncConnection, tenant_id: uuid.UUID) -> int:
    """Unfinished jobs, from the counter kept with the writes (not a count of them)."""
    return int(await conn.scalar(_ACTIVE_FOLD, {"tenant_id": tenant_id}) or 0)


async def tenant_count_active_jobs_exactly(conn: AsyncConnection, tenant_id: uuid.UUID) -> int:
    """Unfinished jobs counted (its waiting and its running jobs, each by its index): what the
    counter must equal; for tests and bench/quota_scale.py, never a request's path."""
    return int(await conn.scalar(select(unfinished_jobs_count(tenant_id))) or 0)


def _api_rate_take_statement() -> Any:
    """Takes up to :want tokens from the tenant's bucket (refilled at its rate since the last
    take, capped at BURST_S seconds' worth); returns the tokens granted, those left, and the
    rate. Built once: every refill of every replica runs the same statement."""
    tenant = bindparam("tenant_id", type_=UUID(as_uuid=True))
    override = select(tenant_limits.c.requests_per_s).where(tenant_limits.c.tenant_id == tenant).scalar_subquery()
    rate = func.coalesce(override, cast(bindparam("default_rate"), Double))
    capacity = func.greatest(rate * BURST_S, 1.0)
    want = cast(bindparam("want"), Double)
    stored = api_rate_buckets.c
    elapsed = func.extract("epoch", func.now() - stored.updated_at)
    available = func.least(capacity, stored.tokens + rate * elapsed)
    granted = func.least(want, func.floor(available))
    first_grant = func.least(want, capacity)
    stmt = insert(api_rate_buckets).from_select(
        ["tenant_id", "tokens", "granted"],
        select(tenant, capacity - first_grant, first_grant),
    )
    return stmt.on_conflict_do_update(
        index_elements=["tenant_id"],
        set_={"tokens": available - granted, "granted": granted, "updated_at": func.now()},
    ).returning(stored.granted, stored.tokens, rate.label("rate"))


API_RATE_TAKE = _api_rate_take_statement()


async def api_rate_take(
    conn: AsyncConnection, tenant_id: uuid.UUID, default_rate: float, want: int
) -> tuple[int, float, float]:
    """(tokens granted, tokens left, the tenant's rate per second; 0 = unlimited)."""
    row: RowMapping = (
        (await conn.execute(API_RATE_TAKE, {"tenant_id": tenant_id, "default_rate": default_rate, "want": want}))
        .mappings()
        .one()
    )
    return int(row["granted"]), float(row["tokens"]), float(row["rate"])
