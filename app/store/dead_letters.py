"""The dead-letter queue: one row per occurrence that exhausted its attempts."""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, Text, and_, cast, column, delete, func, or_, select, update, values
from sqlalchemy.dialects.postgresql import UUID, insert
from sqlalchemy.engine import RowMapping

from app.db.async_engine import AsyncConnection
from app.store.tables import dead_letters, jobs, runs


@dataclass(frozen=True)
class DeadLetterFilter:
    job_id: uuid.UUID | None = None
    target_id: uuid.UUID | None = None
    since: dt.datetime | None = None  # created_at >= since
    until: dt.datetime | None = None  # created_at < until
    last_status_code: int | None = None
    # False: only dead letters never replayed.
    include_replayed: bool = True
    # Only the dead letters of jobs carrying these labels (the job's labels as they are now).
    labels: dict[str, str] | None = None


async def dead_letter_insert_many(conn: AsyncConnection, rows: list[dict[str, Any]]) -> None:
    # One dead letter per occurrence, even if two processes race to write it.
    stmt = insert(dead_letters).on_conflict_do_nothing(index_elements=["occurrence_id"])
    await conn.execute(stmt, rows)


async def dead_letter_list(
    conn: AsyncConnection,
    tenant_id: uuid.UUID,
    limit: int,
    after: tuple[dt.datetime, uuid.UUID] | None,
    where: DeadLetterFilter = DeadLetterFilter(),
    with_payload: bool = True,
    with_payload_bytes: bool = False,
) -> list[RowMapping]:
    """Newest first; optionally without payloads, and with each payload's JSON text size."""
    columns: list[Any] = [*(column for column in dead_letters.c if with_payload or column.name != "payload")]
    # The job's name, by its primary key, for each row of the page only.
    columns.append(select(jobs.c.name).where(jobs.c.id == dead_letters.c.job_id).scalar_subquery().label("job_name"))
    if with_payload_bytes:
        columns.append(func.octet_length(cast(dead_letters.c.payload, Text)).label("payload_bytes"))
    stmt = _filtered(select(*columns), tenant_id, where or DeadLetterFilter())
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


async def dead_letter_payloads(
    conn: AsyncConnection, tenant_id: uuid.UUID, dead_letter_ids: list[uuid.UUID]
) -> dict[uuid.UUID, Any]:
    stmt = select(dead_letters.c.id, dead_letters.c.payload).where(
        dead_letters.c.tenant_id == tenant_id, dead_letters.c.id.in_(dead_letter_ids)
    )
    return {row.id: row.payload for row in await conn.execute(stmt)}


def _filtered(stmt: Select[Any], tenant_id: uuid.UUID, where: DeadLetterFilter) -> Select[Any]:
    stmt = stmt.where(dead_letters.c.tenant_id == tenant_id)
    if where.job_id is not None:
        stmt = stmt.where(dead_letters.c.job_id == where.job_id)
    if where.target_id is not None:
        stmt = stmt.where(dead_letters.c.target_id == where.target_id)
    if where.since is not None:
        stmt = stmt.where(dead_letters.c.created_at >= where.since)
    if where.until is not None:
        stmt = stmt.where(dead_letters.c.created_at < where.until)
    if where.last_status_code is not None:
        stmt = stmt.where(dead_letters.c.last_status_code == where.last_status_code)
    if not where.include_replayed:
        stmt = stmt.where(dead_letters.c.replayed_at.is_(None))
    if where.labels:
        labelled = select(jobs.c.id).where(jobs.c.tenant_id == tenant_id, jobs.c.labels.contains(where.labels))
        stmt = stmt.where(dead_letters.c.job_id.in_(labelled))
    return stmt


def _with_job_policy() -> Select[Any]:
    """Dead letters with the original job's name and retry policy (what a replay copies)."""
    return select(
        dead_letters,
        jobs.c.name.label("job_name"),
        jobs.c.max_attempts,
        jobs.c.backoff_base_s,
        jobs.c.backoff_max_s,
        jobs.c.backoff_factor,
        jobs.c.priority,
        # A replay is delivered as the original was: the job's own completion settings.
        jobs.c.completion,
        jobs.c.async_timeout_s,
        jobs.c.heartbeat_timeout_s,
    ).join(jobs, jobs.c.id == dead_letters.c.job_id)


async def dead_letter_get(conn: AsyncConnection, tenant_id: uuid.UUID, dead_letter_id: uuid.UUID) -> RowMapping | None:
    stmt = _with_job_policy().where(dead_letters.c.id == dead_letter_id, dead_letters.c.tenant_id == tenant_id)
    row: RowMapping | None = (await conn.execute(stmt)).mappings().one_or_none()
    return row


async def dead_letter_lock_for_replay(
    conn: AsyncConnection, tenant_id: uuid.UUID, where: DeadLetterFilter, limit: int
) -> list[RowMapping]:
    """Oldest first, row-locked (SKIP LOCKED) so two concurrent bulk replays split the work."""
    stmt = (
        _filtered(_with_job_policy(), tenant_id, where)
        .order_by(dead_letters.c.created_at, dead_letters.c.id)
        .limit(limit)
        .with_for_update(of=dead_letters, skip_locked=True)
    )
    return list((await conn.execute(stmt)).mappings().all())


async def dead_letter_runs(conn: AsyncConnection, occurrence_id: uuid.UUID) -> list[RowMapping]:
    """The attempts of the occurrence that was dead-lettered, oldest first."""
    stmt = select(runs).where(runs.c.occurrence_id == occurrence_id).order_by(runs.c.id)
    return list((await conn.execute(stmt)).mappings().all())


async def dead_letter_mark_replayed(
    conn: AsyncConnection, tenant_id: uuid.UUID, replays: list[tuple[uuid.UUID, uuid.UUID]]
) -> None:
    """Records (dead letter id, replay job id) pairs in one UPDATE."""
    if not replays:
        return
    replay = values(column("id", UUID(as_uuid=True)), column("job_id", UUID(as_uuid=True)), name="replay").data(replays)
    await conn.execute(
        update(dead_letters)
        .where(dead_letters.c.id == replay.c.id, dead_letters.c.tenant_id == tenant_id)
        .values(replayed_at=func.now(), replay_job_id=replay.c.job_id)
    )


async def dead_letter_delete(conn: AsyncConnection, tenant_id: uuid.UUID, dead_letter_id: uuid.UUID) -> bool:
    stmt = (
        delete(dead_letters)
        .where(dead_letters.c.id == dead_letter_id, dead_letters.c.tenant_id == tenant_id)
        .returning(dead_letters.c.id)
    )
    return (await conn.execute(stmt)).first() is not None
