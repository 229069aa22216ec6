"""Named schedules in the store: the job a tenant's key names (among its unfinished jobs),
read, or locked with the key itself, and the key given to a new job."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import ColumnElement, Text, all_, and_, any_, bindparam, func, literal, select, update
from sqlalchemy.dialects.postgresql import ARRAY, UUID
from sqlalchemy.engine import RowMapping

from app.db.async_engine import AsyncConnection
from app.domain.states import TERMINAL_STATES
from app.store.tables import jobs

_TERMINAL = sorted(state.value for state in TERMINAL_STATES)


def _named(tenant_id: uuid.UUID, key: str) -> ColumnElement[bool]:
    return and_(jobs.c.tenant_id == tenant_id, jobs.c.schedule_key == key, jobs.c.state.not_in(_TERMINAL))


async def job_by_key(conn: AsyncConnection, tenant_id: uuid.UUID, key: str) -> RowMapping | None:
    return (await conn.execute(select(jobs).where(_named(tenant_id, key)))).mappings().one_or_none()


async def job_lock_by_key(conn: AsyncConnection, tenant_id: uuid.UUID, key: str) -> RowMapping | None:
    """The job the key names, row-locked, with the key itself locked for this transaction (a
    transaction-level advisory lock on the tenant and key): concurrent upserts of one key
    queue here, so the first creates and the others find its job."""
    found = await job_lock_keys(conn, tenant_id, [key])
    return found[0] if found else None


async def job_set_key(conn: AsyncConnection, job_id: uuid.UUID, key: str) -> RowMapping:
    """Names a job just created in this transaction; the row as it is now."""
    stmt = update(jobs).where(jobs.c.id == job_id).values(schedule_key=key).returning(*jobs.c)
    return (await conn.execute(stmt)).mappings().one()


def _key_lock(tenant_id: uuid.UUID, key: Any) -> Any:
    """The advisory lock's id for a tenant's key (the same as job_lock_by_key takes)."""
    return func.hashtextextended(literal(f"schedule:{tenant_id}:") + key, 0)


async def job_lock_keys(conn: AsyncConnection, tenant_id: uuid.UUID, keys: list[str]) -> list[RowMapping]:
    """job_lock_by_key for many keys in two statements: the keys' locks, taken in sorted order
    (two sets sharing keys cannot deadlock), then the unfinished jobs they name, row-locked."""
    if not keys:
        return []
    listed = func.unnest(bindparam("keys", sorted(keys), type_=ARRAY(Text))).table_valued("key").render_derived()
    locks = select(func.pg_advisory_xact_lock(_key_lock(tenant_id, listed.c.key))).select_from(listed)
    await conn.execute(locks.order_by(listed.c.key))
    stmt = (
        select(jobs)
        .where(
            jobs.c.tenant_id == tenant_id,
            jobs.c.schedule_key == any_(bindparam("wanted", keys, type_=ARRAY(Text))),
            jobs.c.state.not_in(_TERMINAL),
        )
        .with_for_update()
    )
    return list((await conn.execute(stmt)).mappings().all())


async def job_set_members_unlisted(
    conn: AsyncConnection, tenant_id: uuid.UUID, set_name: str, keys: list[str]
) -> list[RowMapping]:
    """The set's unfinished schedules whose keys are not among `keys`, row-locked (a prune)."""
    stmt = (
        select(jobs)
        .where(
            jobs.c.tenant_id == tenant_id,
            jobs.c.schedule_set == set_name,
            jobs.c.state.not_in(_TERMINAL),
            jobs.c.schedule_key != all_(bindparam("listed", keys, type_=ARRAY(Text))),
        )
        .order_by(jobs.c.schedule_key)
        .with_for_update()
    )
    return list((await conn.execute(stmt)).mappings().all())


async def job_name_many(
    conn: AsyncConnection, job_ids: list[uuid.UUID], keys: list[str | None], set_name: str | None
) -> None:
    """Gives jobs their keys (None: keeps the job's own) and puts them in `set_name`: one UPDATE."""
    if not job_ids:
        return
    named = (
        func.unnest(
            bindparam("ids", job_ids, type_=ARRAY(UUID(as_uuid=True))), bindparam("names", keys, type_=ARRAY(Text))
        )
        .table_valued("id", "key")
        .render_derived(name="named")
    )
    await conn.execute(
        update(jobs)
        .where(jobs.c.id == named.c.id)
        .values(schedule_key=func.coalesce(named.c.key, jobs.c.schedule_key), schedule_set=set_name)
    )


async def schedule_list(
    conn: AsyncConnection,
    tenant_id: uuid.UUID,
    set_name: str | None,
    limit: int,
    after: str | None,
    labels: dict[str, str] | None = None,
) -> list[RowMapping]:
    """The tenant's unfinished named schedules (of `set_name`, if given), by key, after `after`."""
    stmt = select(jobs).where(
        jobs.c.tenant_id == tenant_id, jobs.c.schedule_key.is_not(None), jobs.c.state.not_in(_TERMINAL)
    )
    if set_name is not None:
        stmt = stmt.where(jobs.c.schedule_set == set_name)
    if labels:
        stmt = stmt.where(jobs.c.labels.contains(labels))
    if after is not None:
        stmt = stmt.where(jobs.c.schedule_key > after)
    return list((await conn.execute(stmt.order_by(jobs.c.schedule_key).limit(limit))).mappings().all())
