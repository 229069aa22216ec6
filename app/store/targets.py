"""Webhook targets: where a tenant's jobs are delivered, and the secret they are signed with."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterable
from typing import Any

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection

from app.domain.signing import new_signing_secret
from app.domain.states import TERMINAL_STATES
from app.store.tables import jobs, targets

# Everything but the secret: reads never return it.
PUBLIC_COLUMNS = (
    targets.c.id,
    targets.c.name,
    targets.c.url,
    targets.c.headers,
    targets.c.timeout_s,
    targets.c.retry_on_status,
    targets.c.created_at,
    targets.c.updated_at,
)


def _live(tenant_id: uuid.UUID, target_id: uuid.UUID) -> Any:
    return and_(targets.c.id == target_id, targets.c.tenant_id == tenant_id, targets.c.deleted_at.is_(None))


async def target_create(
    conn: AsyncConnection,
    tenant_id: uuid.UUID,
    name: str,
    url: str,
    headers: dict[str, str],
    timeout_s: float,
    retry_on_status: list[int] | None = None,
) -> tuple[RowMapping, str]:
    """Returns the public row and the new signing secret."""
    secret = new_signing_secret()
    stmt = (
        targets.insert()
        .values(
            tenant_id=tenant_id,
            name=name,
            url=url,
            headers=headers,
            timeout_s=timeout_s,
            retry_on_status=retry_on_status,
            signing_secret=secret,
        )
        .returning(*PUBLIC_COLUMNS)
    )
    row = (await conn.execute(stmt)).mappings().one()
    return row, secret


async def target_get(conn: AsyncConnection, tenant_id: uuid.UUID, target_id: uuid.UUID) -> RowMapping | None:
    result = await conn.execute(select(*PUBLIC_COLUMNS).where(_live(tenant_id, target_id)))
    return result.mappings().one_or_none()


async def target_list(
    conn: AsyncConnection, tenant_id: uuid.UUID, limit: int, after: tuple[dt.datetime, uuid.UUID] | None
) -> list[RowMapping]:
    stmt = select(*PUBLIC_COLUMNS).where(targets.c.tenant_id == tenant_id, targets.c.deleted_at.is_(None))
    if after is not None:
        created, ident = after
        stmt = stmt.where(
            or_(targets.c.created_at < created, and_(targets.c.created_at == created, targets.c.id < ident))
        )
    stmt = stmt.order_by(targets.c.created_at.desc(), targets.c.id.desc()).limit(limit)
    return list((await conn.execute(stmt)).mappings().all())


async def target_update(
    conn: AsyncConnection, tenant_id: uuid.UUID, target_id: uuid.UUID, changes: dict[str, Any]
) -> RowMapping | None:
    stmt = (
        update(targets)
        .where(_live(tenant_id, target_id))
        .values(**changes, updated_at=func.now())
        .returning(*PUBLIC_COLUMNS)
    )
    return (await conn.execute(stmt)).mappings().one_or_none()


async def target_rotate_secret(conn: AsyncConnection, tenant_id: uuid.UUID, target_id: uuid.UUID) -> str | None:
    secret = new_signing_secret()
    stmt = (
        update(targets)
        .where(_live(tenant_id, target_id))
        .values(signing_secret=secret, updated_at=func.now())
        .returning(targets.c.id)
    )
    if (await conn.execute(stmt)).first() is None:
        return None
    return secret


async def target_count_active_jobs(conn: AsyncConnection, target_id: uuid.UUID) -> int:
    stmt = select(func.count()).where(
        jobs.c.target_id == target_id, jobs.c.state.not_in([s.value for s in TERMINAL_STATES])
    )
    return int(await conn.scalar(stmt) or 0)


async def target_lock_for_delete(conn: AsyncConnection, tenant_id: uuid.UUID, target_id: uuid.UUID) -> bool:
    stmt = select(targets.c.id).where(_live(tenant_id, target_id)).with_for_update()
    return (await conn.execute(stmt)).first() is not None


async def target_delete(conn: AsyncConnection, tenant_id: uuid.UUID, target_id: uuid.UUID) -> bool:
    """Soft delete: finished jobs and their runs still refer to the target."""
    stmt = update(targets).where(_live(tenant_id, target_id)).values(deleted_at=func.now()).returning(targets.c.id)
    return (await conn.execute(stmt)).first() is not None


async def target_lock_live(conn: AsyncConnection, tenant_id: uuid.UUID, target_id: uuid.UUID) -> bool:
    return target_id in await target_lock_live_many(conn, tenant_id, [target_id])


async def target_lock_live_many(
    conn: AsyncConnection, tenant_id: uuid.UUID, target_ids: Iterable[uuid.UUID]
) -> set[uuid.UUID]:
    """Share-locks the live targets among `target_ids` for the rest of the transaction.

    Job creation takes it (creations do not block each other); deletion takes the exclusive
    lock first, so it sees every job created before it and none is created after it.
    """
    stmt = (
        select(targets.c.id)
        .where(
            targets.c.id.in_(list(target_ids)),
            targets.c.tenant_id == tenant_id,
            targets.c.deleted_at.is_(None),
        )
        .with_for_update(read=True)
    )
    return set((await conn.execute(stmt)).scalars().all())
