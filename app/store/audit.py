"""The audit log: one append-only row per mutation, ids only (never secrets or payloads)."""

from __future__ import annotations

import uuid

from sqlalchemy import bindparam, select
from sqlalchemy.engine import RowMapping

from app.db.async_engine import AsyncConnection
from app.store.tables import audit_log

AUDIT_COLUMNS = (
    audit_log.c.id,
    audit_log.c.api_key_id,
    audit_log.c.actor,
    audit_log.c.action,
    audit_log.c.object_id,
    audit_log.c.request_id,
    audit_log.c.created_at,
)
# Built once, with the columns an entry sets (the others are the table's defaults).
AUDIT_APPEND = audit_log.insert().values(
    {
        name: bindparam(name, type_=audit_log.c[name].type)
        for name in ("tenant_id", "api_key_id", "actor", "action", "object_id", "request_id")
    }
)


async def audit_append(
    conn: AsyncConnection,
    *,
    tenant_id: uuid.UUID,
    actor: str,
    action: str,
    object_id: str | None,
    request_id: str | None,
    api_key_id: uuid.UUID | None = None,
) -> None:
    await conn.execute(
        AUDIT_APPEND,
        {
            "tenant_id": tenant_id,
            "api_key_id": api_key_id,
            "actor": actor,
            "action": action,
            "object_id": object_id,
            "request_id": request_id,
        },
    )


async def audit_list(
    conn: AsyncConnection, tenant_id: uuid.UUID, limit: int, before_id: int | None
) -> list[RowMapping]:
    """Newest first."""
    stmt = select(*AUDIT_COLUMNS).where(audit_log.c.tenant_id == tenant_id)
    if before_id is not None:
        stmt = stmt.where(audit_log.c.id < before_id)
    stmt = stmt.order_by(audit_log.c.id.desc()).limit(limit)
    return list((await conn.execute(stmt)).mappings().all())
