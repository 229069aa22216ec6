"""Targets by name: the live targets of a tenant that carry a name, read, or locked with the
name itself so that concurrent PUTs of one name (app/api/target_upserts.py) queue.

Names are not unique (POST /v1/targets and PATCH never refused a duplicate), so both answer a
list: at most two rows, enough to tell one target from an ambiguous name.
"""

from __future__ import annotations

import uuid

from sqlalchemy import ColumnElement, and_, func, select
from sqlalchemy.engine import RowMapping

from app.db.async_engine import AsyncConnection
from app.store.tables import targets
from app.store.targets import PUBLIC_COLUMNS, target_live

# One target, or the proof that the name is ambiguous.
_ENOUGH = 2


def _named(tenant_id: uuid.UUID, name: str) -> ColumnElement[bool]:
    return and_(target_live(tenant_id), targets.c.name == name)


async def target_find_by_name(conn: AsyncConnection, tenant_id: uuid.UUID, name: str) -> list[RowMapping]:
    """The tenant's live targets named `name` (at most two, oldest first); secrets never read."""
    stmt = select(*PUBLIC_COLUMNS).where(_named(tenant_id, name)).order_by(targets.c.created_at, targets.c.id)
    return list((await conn.execute(stmt.limit(_ENOUGH))).mappings().all())


async def target_lock_by_name(conn: AsyncConnection, tenant_id: uuid.UUID, name: str) -> list[RowMapping]:
    """As target_find_by_name, the rows locked, with the name itself locked for this
    transaction (a transaction-level advisory lock on the tenant and name): concurrent PUTs of
    one name queue here, so the first creates the target and the others find it."""
    await conn.execute(select(func.pg_advisory_xact_lock(func.hashtextextended(f"target:{tenant_id}:{name}", 0))))
    stmt = (
        select(*PUBLIC_COLUMNS)
        .where(_named(tenant_id, name))
        .order_by(targets.c.created_at, targets.c.id)
        .limit(_ENOUGH)
        .with_for_update()
    )
    return list((await conn.execute(stmt)).mappings().all())
