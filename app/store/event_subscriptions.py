"""Event subscriptions in the store: which of a tenant's targets receive which event types
(app/domain/events.py). The events themselves are written by app/store/events.py."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from sqlalchemy import and_, delete, or_, select
from sqlalchemy.engine import RowMapping

from app.db.async_engine import AsyncConnection
from app.domain.events import EventType
from app.store.tables_watch import event_subscriptions

PUBLIC_COLUMNS = (
    event_subscriptions.c.id,
    event_subscriptions.c.target_id,
    event_subscriptions.c.types,
    event_subscriptions.c.description,
    event_subscriptions.c.created_at,
)


def _owned(tenant_id: uuid.UUID, subscription_id: uuid.UUID) -> Any:
    return and_(event_subscriptions.c.id == subscription_id, event_subscriptions.c.tenant_id == tenant_id)


async def event_subscription_create(
    conn: AsyncConnection,
    tenant_id: uuid.UUID,
    target_id: uuid.UUID,
    types: list[EventType],
    description: str | None,
) -> RowMapping:
    stmt = (
        event_subscriptions.insert()
        .values(
            tenant_id=tenant_id,
            target_id=target_id,
            types=[event_type.value for event_type in types],
            description=description,
        )
        .returning(*PUBLIC_COLUMNS)
    )
    return (await conn.execute(stmt)).mappings().one()


async def event_subscription_get(
    conn: AsyncConnection, tenant_id: uuid.UUID, subscription_id: uuid.UUID
) -> RowMapping | None:
    stmt = select(*PUBLIC_COLUMNS).where(_owned(tenant_id, subscription_id))
    return (await conn.execute(stmt)).mappings().one_or_none()


async def event_subscription_list(
    conn: AsyncConnection,
    tenant_id: uuid.UUID,
    limit: int,
    after: tuple[dt.datetime, uuid.UUID] | None,
    target_id: uuid.UUID | None = None,
) -> list[RowMapping]:
    """Newest first."""
    columns = event_subscriptions.c
    stmt = select(*PUBLIC_COLUMNS).where(columns.tenant_id == tenant_id)
    if target_id is not None:
        stmt = stmt.where(columns.target_id == target_id)
    if after is not None:
        created, ident = after
        stmt = stmt.where(or_(columns.created_at < created, and_(columns.created_at == created, columns.id < ident)))
    stmt = stmt.order_by(columns.created_at.desc(), columns.id.desc()).limit(limit)
    return list((await conn.execute(stmt)).mappings().all())


async def event_subscription_delete(conn: AsyncConnection, tenant_id: uuid.UUID, subscription_id: uuid.UUID) -> bool:
    """False when the tenant has no such subscription. Events already written stay (they
    are jobs of their own, delivered as usual)."""
    stmt = delete(event_subscriptions).where(_owned(tenant_id, subscription_id)).returning(event_subscriptions.c.id)
    return (await conn.execute(stmt)).first() is not None
