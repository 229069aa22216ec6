"""/v1/audit: the tenant's own audit log, newest first."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from app.api.deps import Conn, TenantId
from app.api.schemas.pages import Page, page_of
from app.api.schemas.security import AuditEntry
from app.store.audit import audit_list
from app.store.pagination import decode_int_cursor, encode_cursor

router = APIRouter(prefix="/v1/audit", tags=["audit"])


@router.get("", operation_id="listAudit")
async def list_audit(
    tenant_id: TenantId,
    conn: Conn,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    cursor: str | None = None,
) -> Page[AuditEntry]:
    """Every mutation made in this tenant: who (API key id), what (operation, object id), the
    request id and when. Holds no secrets or payloads."""
    before = decode_int_cursor(cursor) if cursor else None
    rows = await audit_list(conn, tenant_id, limit + 1, before)
    return page_of(rows, limit, lambda row: AuditEntry.model_validate(dict(row)), lambda row: encode_cursor(row["id"]))
