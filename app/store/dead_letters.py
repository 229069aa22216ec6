"""The dead-letter queue: one row per occurrence that exhausted its attempts."""

from __future__ import annotations

import datetime as dt
import uuid

from sqlalchemy import and_, or_, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection

from app.store.tables import dead_letters


async def dead_letter_insert(
    conn: AsyncConnection,
    *,
    tenant_id: uuid.UUID,
    job_id: uuid.UUID,
    target_id: uuid.UUID,
    occurrence_id: uuid.UUID,
    scheduled_for: dt.datetime,
    payload: object,
    attempts: int,
    last_status_code: int | None,
    last_error: str | None,
) -> None:
    stmt = (
        insert(dead_letters)
        .values(
            tenant_id=tenant_id,
            job_id=job_id,
            target_id=target_id,
            occurrence_id=occurrence_id,
            scheduled_for=scheduled_for,
            payload=payload,
            attempts=attempts,
            last_status_code=last_status_code,
            last_error=last_error,
        )
        .on_conflict_do_nothing(index_elements=["occurrence_id"])
    )
    await conn.execute(stmt)


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
