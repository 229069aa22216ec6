"""Webhook targets: where a tenant's jobs are delivered, and the secret they are signed with.

Signing secrets and header values are written sealed (app/keyring.py): a backup or a SELECT
shows neither.
"""

from __future__ import annotations

import datetime as dt
import math
import uuid
from collections.abc import Iterable
from typing import Any

from sqlalchemy import ColumnElement, Double, Select, and_, any_, bindparam, func, literal, or_, select, update
from sqlalchemy.dialects.postgresql import ARRAY, UUID
from sqlalchemy.engine import RowMapping

from app.db.async_engine import AsyncConnection
from app.domain.completion import ASYNC_OWNER
from app.domain.signing import new_signing_secret
from app.domain.states import JobState
from app.keyring import SIGNING_SECRET, KeyRing
from app.store.tables import NOT_WAITING_STATES, jobs, state_in, targets, tenants

# Everything but the secret: reads never return it.
PUBLIC_COLUMNS = (
    targets.c.id,
    targets.c.name,
    targets.c.labels,
    targets.c.url,
    targets.c.headers,
    targets.c.timeout_s,
    targets.c.retry_on_status,
    targets.c.max_in_flight,
    targets.c.rate_per_s,
    targets.c.completion,
    targets.c.async_timeout_s,
    targets.c.heartbeat_timeout_s,
    targets.c.async_counts_in_flight,
    # Pause and hold (app/store/pauses.py), and auto-pause after failed attempts in a row.
    targets.c.paused_at,
    targets.c.paused_until,
    targets.c.paused_reason,
    targets.c.pause_kind,
    targets.c.auto_pause_failures,
    targets.c.consecutive_failures,
    targets.c.created_at,
    targets.c.updated_at,
)


def target_live(tenant_id: Any, target_id: Any = None) -> ColumnElement[bool]:
    """The live targets of the tenant (its own, not deleted), or among them the one(s)
    `target_id` names: a value, a bind parameter, or `any_()` of an array of ids. The one
    place the rule is written: reads, writes, quotas and the creates' INSERTs use it."""
    live = and_(targets.c.tenant_id == tenant_id, targets.c.deleted_at.is_(None))
    return live if target_id is None else and_(targets.c.id == target_id, live)


def target_share_lock_live(tenant_id: Any, target_id: Any) -> Select[uuid.UUID]:
    """The ids of the live targets `target_id` names (as target_live), share-locked for the
    rest of the transaction. Job creation takes this lock (creations do not block each
    other); deletion takes the exclusive lock first, so it sees every job created before it
    and none is created after it."""
    return select(targets.c.id).where(target_live(tenant_id, target_id)).with_for_update(read=True)


# Built once: every create outside the single-statement path takes it (app/api/checks.py).
_LOCK_LIVE_MANY = target_share_lock_live(
    bindparam("tenant_id", type_=UUID(as_uuid=True)),
    any_(bindparam("target_ids", type_=ARRAY(UUID(as_uuid=True)))),
)


async def target_create(
    conn: AsyncConnection,
    key_ring: KeyRing,
    tenant_id: uuid.UUID,
    name: str,
    url: str,
    headers: dict[str, str],
    timeout_s: float,
    retry_on_status: list[int] | None = None,
    max_in_flight: int | None = None,
    rate_per_s: float | None = None,
    completion: dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
    auto_pause_failures: int | None = None,
) -> tuple[RowMapping, str]:
    """The public row and the new signing secret. `completion`: the completion columns set
    (app/domain/completion.py), else their defaults."""
    secret = new_signing_secret()
    stmt = (
        targets.insert()
        .values(
            tenant_id=tenant_id,
            name=name,
            url=url,
            headers=key_ring.seal_headers(headers),
            timeout_s=timeout_s,
            retry_on_status=retry_on_status,
            max_in_flight=max_in_flight,
            rate_per_s=rate_per_s,
            **(completion or {}),
            labels=labels or {},
            auto_pause_failures=auto_pause_failures,
            signing_secret=key_ring.seal(secret, SIGNING_SECRET),
        )
        .returning(*PUBLIC_COLUMNS)
    )
    row = (await conn.execute(stmt)).mappings().one()
    return row, secret


async def target_get(conn: AsyncConnection, tenant_id: uuid.UUID, target_id: uuid.UUID) -> RowMapping | None:
    result = await conn.execute(select(*PUBLIC_COLUMNS).where(target_live(tenant_id, target_id)))
    return result.mappings().one_or_none()


async def target_list(
    conn: AsyncConnection,
    tenant_id: uuid.UUID,
    limit: int,
    after: tuple[dt.datetime, uuid.UUID] | None,
    labels: dict[str, str] | None = None,
) -> list[RowMapping]:
    stmt = select(*PUBLIC_COLUMNS).where(target_live(tenant_id))
    if labels:
        stmt = stmt.where(targets.c.labels.contains(labels))
    if after is not None:
        created, ident = after
        stmt = stmt.where(
            or_(targets.c.created_at < created, and_(targets.c.created_at == created, targets.c.id < ident))
        )
    stmt = stmt.order_by(targets.c.created_at.desc(), targets.c.id.desc()).limit(limit)
    return list((await conn.execute(stmt)).mappings().all())


async def target_update(
    conn: AsyncConnection, key_ring: KeyRing, tenant_id: uuid.UUID, target_id: uuid.UUID, changes: dict[str, Any]
) -> RowMapping | None:
    if "rate_per_s" in changes:
        # A new rate starts with a full bucket.
        changes = {**changes, "rate_tokens": None, "rate_updated_at": None}
    if changes.get("headers"):
        changes = {**changes, "headers": key_ring.seal_headers(changes["headers"])}
    if "auto_pause_failures" in changes and changes["auto_pause_failures"] is None:
        # Without auto-pause no run of failures is kept (the outcome statement skips the
        # target): one kept now would be stale when auto-pause is set again.
        changes = {**changes, "consecutive_failures": 0}
    stmt = (
        update(targets)
        .where(target_live(tenant_id, target_id))
        .values(**changes, updated_at=func.now())
        .returning(*PUBLIC_COLUMNS)
    )
    return (await conn.execute(stmt)).mappings().one_or_none()


async def target_get_signing_secret(
    conn: AsyncConnection, key_ring: KeyRing, tenant_id: uuid.UUID, target_id: uuid.UUID
) -> str:
    """The target's current secret, for replaying its create response (stored without it).

    Soft-deleted targets included, so a replay answers what the create answered.
    """
    stmt = select(targets.c.signing_secret).where(targets.c.id == target_id, targets.c.tenant_id == tenant_id)
    sealed: str = (await conn.execute(stmt)).scalar_one()
    return key_ring.open(sealed, SIGNING_SECRET)


async def target_rotate_secret(
    conn: AsyncConnection, key_ring: KeyRing, tenant_id: uuid.UUID, target_id: uuid.UUID, grace_s: float
) -> str | None:
    """A new secret; the current one keeps signing alongside it for `grace_s` seconds."""
    secret = new_signing_secret()
    keep_previous = grace_s > 0
    stmt = (
        update(targets)
        .where(target_live(tenant_id, target_id))
        .values(
            signing_secret=key_ring.seal(secret, SIGNING_SECRET),
            previous_signing_secret=targets.c.signing_secret if keep_previous else None,
            previous_secret_expires_at=func.now() + dt.timedelta(seconds=grace_s) if keep_previous else None,
            updated_at=func.now(),
        )
        .returning(targets.c.id)
    )
    if (await conn.execute(stmt)).first() is None:
        return None
    return secret


def unfinished_jobs_count(tenant_id: Any, target_id: Any | None = None) -> Any:
    """The count of a tenant's (or one of its targets') unfinished jobs, as an expression: its
    waiting jobs (ix_jobs_tenant_waiting) plus its running ones (ix_jobs_running), each
    condition spelled as its index's predicate."""
    of_target = [] if target_id is None else [jobs.c.target_id == target_id]
    waiting = select(func.count()).where(jobs.c.tenant_id == tenant_id, *of_target, ~state_in(NOT_WAITING_STATES))
    running = select(func.count()).where(*of_target, jobs.c.tenant_id == tenant_id, state_in([JobState.RUNNING]))
    return waiting.scalar_subquery() + running.scalar_subquery()


async def target_count_active_jobs(conn: AsyncConnection, target_id: uuid.UUID) -> int:
    tenant_id = select(targets.c.tenant_id).where(targets.c.id == target_id).scalar_subquery()
    return int(await conn.scalar(select(unfinished_jobs_count(tenant_id, target_id))) or 0)


async def target_lock_for_delete(conn: AsyncConnection, tenant_id: uuid.UUID, target_id: uuid.UUID) -> bool:
    stmt = select(targets.c.id).where(target_live(tenant_id, target_id)).with_for_update()
    return (await conn.execute(stmt)).first() is not None


async def target_delete(conn: AsyncConnection, tenant_id: uuid.UUID, target_id: uuid.UUID) -> bool:
    """Soft delete: finished jobs and their runs still refer to the target."""
    stmt = (
        update(targets).where(target_live(tenant_id, target_id)).values(deleted_at=func.now()).returning(targets.c.id)
    )
    return (await conn.execute(stmt)).first() is not None


async def target_lock_live(conn: AsyncConnection, tenant_id: uuid.UUID, target_id: uuid.UUID) -> bool:
    return target_id in await target_lock_live_many(conn, tenant_id, [target_id])


async def target_lock_live_many(
    conn: AsyncConnection, tenant_id: uuid.UUID, target_ids: Iterable[uuid.UUID]
) -> set[uuid.UUID]:
    """Share-locks the live targets among `target_ids` (target_share_lock_live)."""
    found = await conn.execute(_LOCK_LIVE_MANY, {"tenant_id": tenant_id, "target_ids": list(target_ids)})
    return set(found.scalars().all())


# Delivery limits. A target's token bucket holds at most one second's worth of tokens (at
# least one); tokens accrue continuously at `rate_per_s` from `rate_updated_at`.
def _bucket_capacity() -> Any:
    return func.greatest(targets.c.rate_per_s, 1.0)


def _tokens_now() -> Any:
    elapsed = func.extract("epoch", func.now() - func.coalesce(targets.c.rate_updated_at, func.now()))
    return func.least(
        _bucket_capacity(), func.coalesce(targets.c.rate_tokens, _bucket_capacity()) + targets.c.rate_per_s * elapsed
    )


def _in_flight() -> Any:
    """The target's deliveries in flight: its running jobs, open asynchronous attempts
    included unless the target says they do not count (async_counts_in_flight)."""
    running = jobs.alias("running")
    return (
        select(func.count())
        .where(
            running.c.target_id == targets.c.id,
            state_in([JobState.RUNNING], running.c.state),
            targets.c.async_counts_in_flight | running.c.lease_owner.is_distinct_from(ASYNC_OWNER),
        )
        .scalar_subquery()
    )


def target_paused() -> ColumnElement[bool]:
    """The target is paused, or its tenant is (app/store/pauses.py): none of its occurrences
    is claimed until the resume."""
    paused_tenants = select(tenants.c.id).where(tenants.c.paused_at.is_not(None))
    return or_(targets.c.paused_at.is_not(None), targets.c.tenant_id.in_(paused_tenants))


def target_saturated_ids() -> Any:
    """Targets that can take no delivery right now (at max_in_flight, out of tokens, or
    paused)."""
    return select(targets.c.id).where(
        or_(
            and_(targets.c.max_in_flight.is_not(None), _in_flight() >= targets.c.max_in_flight),
            and_(targets.c.rate_per_s.is_not(None), _tokens_now() < 1),
            target_paused(),
        )
    )


async def target_take_delivery_slots(conn: AsyncConnection, wanted: dict[uuid.UUID, int]) -> dict[uuid.UUID, int]:
    """How many of `wanted` deliveries each limited target may start now; takes the tokens.

    The targets' rows are locked (in id order) until the claim commits, so concurrent claims
    on any replica see each other's deliveries and tokens: the limits hold cluster-wide.
    """
    # Lock first, read after: a statement that waited for the lock still counts in-flight
    # jobs from the snapshot it started with, which misses the claim it waited for.
    lock = select(targets.c.id).where(targets.c.id.in_(list(wanted))).order_by(targets.c.id).with_for_update()
    await conn.execute(lock)
    stmt = select(
        targets.c.id,
        targets.c.max_in_flight,
        targets.c.rate_per_s,
        _tokens_now().label("tokens"),
        _in_flight().label("in_flight"),
        # Paused since the claim statement's snapshot (an auto-pause just tripped): none.
        target_paused().label("paused"),
    ).where(targets.c.id.in_(list(wanted)))
    granted: dict[uuid.UUID, int] = {}
    tokens_left: dict[uuid.UUID, float] = {}
    for row in await conn.execute(stmt):
        allowed = 0 if row.paused else wanted[row.id]
        if row.max_in_flight is not None:
            allowed = min(allowed, max(0, row.max_in_flight - row.in_flight))
        if row.rate_per_s is not None:
            allowed = min(allowed, max(0, math.floor(row.tokens)))
            tokens_left[row.id] = row.tokens - allowed
        granted[row.id] = allowed
    if tokens_left:
        # Every rate-limited target's bucket in one statement.
        left = (
            func.unnest(
                literal(list(tokens_left), ARRAY(UUID(as_uuid=True))),
                literal(list(tokens_left.values()), ARRAY(Double)),
            )
            .table_valued("id", "tokens")
            .render_derived(name="left_")
        )
        await conn.execute(
            update(targets)
            .where(targets.c.id == left.c.id)
            .values(rate_tokens=left.c.tokens, rate_updated_at=func.now())
        )
    return granted
