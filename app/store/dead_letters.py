"""The dead-letter queue: one row per occurrence that exhausted its attempts."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from sqlalchemy import and_, or_, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection

from app.store.tables import dead_letters


async def dead_letter_insert_many(conn: AsyncConnection, rows: list[dict[str, Any]]) -> None:
    # One dead letter per occurrence, even if two processes race to write it.
    stmt = insert(dead_letters).on_conflict_do_nothing(index_elements=["occurrence_id"])
    await conn.execute(stmt, rows)


async def dead_letter_list(
    conn: AsyncConnection,
    tenant_id: uuid.UUID,
    limit: int,
    after: tuple[dt.datetime, uuid.UUID] | None,
    job_id: uuid.UUID | None = None,
) -> list[RowMapping]:
    stmt = select(dead_letters).where(dead_letters.c.tenant_id == tenant_id)
    if job_id is not None:
        stmt = stmt.where(dead_letters.c.job_id == job_id)
    if after is not None:
        created, ident = after
        stmt = stmt.where(
            or_(
                dead_letters.c.created_at < created,
                and_(dead_letters.c.created_at == created, dead_letters.c.id < ident),
            )
        )
    stmt = stmt.order_by(dead_letters.c.created_at.desc(), dead_letters.c.id.desc()).limit(limit)
    return list((await conn.execute(stmt)).mappings().all())
