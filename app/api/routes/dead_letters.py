"""/v1/dead-letters: occurrences that exhausted their attempts."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query

from app.api.deps import Conn, TenantId
from app.api.schemas import DeadLetterPublic, Page, page_of
from app.store.dead_letters import dead_letter_list
from app.store.pagination import decode_time_id_cursor

router = APIRouter(prefix="/v1/dead-letters", tags=["dead-letters"])


@router.get("", operation_id="listDeadLetters")
async def list_dead_letters(
    tenant_id: TenantId,
    conn: Conn,
    job_id: uuid.UUID | None = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: str | None = None,
) -> Page[DeadLetterPublic]:
    after = decode_time_id_cursor(cursor) if cursor else None
    rows = await dead_letter_list(conn, tenant_id, limit + 1, after, job_id=job_id)
    return page_of(rows, limit, lambda row: DeadLetterPublic.model_validate(dict(row)))
