"""Sealing targets' stored secrets (signing secrets, header values) under the key ring:
rows from before encryption at rest, and every row when the sealing key changes."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import case, func, select, true, union, update

from app.db.async_engine import AsyncConnection, AsyncEngine
from app.keyring import HEADER_VALUE, SEALED_PREFIX, SIGNING_SECRET, KeyRing
from app.store.tables import targets

BATCH = 500


def _key_id(column: Any) -> Any:
    """The sealing key's id; "" for a value in the clear."""
    return case((column.startswith(SEALED_PREFIX), func.split_part(column, ":", 2)), else_="")


async def target_secret_key_ids(conn: AsyncConnection) -> set[str]:
    """The ids of the keys sealing any stored value ("" for a value stored in the clear)."""
    header_values = func.jsonb_each_text(targets.c.headers).table_valued("key", "value").render_derived(name="h")
    stmt = union(
        select(_key_id(targets.c.signing_secret).label("key_id")),
        select(_key_id(targets.c.previous_signing_secret)).where(targets.c.previous_signing_secret.is_not(None)),
        select(_key_id(header_values.c.value)).select_from(targets).join(header_values, true()),
    )
    return {key_id or "" for key_id in (await conn.execute(stmt)).scalars()}


def _reseal(ring: KeyRing, value: str, purpose: str, everything: bool) -> str:
    if not everything and value.startswith(SEALED_PREFIX):
        return value
    if everything and not ring.needs_resealing(value):
        return value
    return ring.seal(ring.open(value, purpose), purpose)


async def target_secrets_reseal(engine: AsyncEngine, ring: KeyRing, everything: bool) -> int:
    """Seals every value stored in the clear (`everything`: and every value not sealed by the
    ring's first key). Batches of rows, each in its own transaction; returns rows changed."""
    changed = 0
    after = uuid.UUID(int=0)
    while True:
        async with engine.begin() as conn:
            stmt = (
                select(targets.c.id, targets.c.signing_secret, targets.c.previous_signing_secret, targets.c.headers)
                .where(targets.c.id > after)
                .order_by(targets.c.id)
                .limit(BATCH)
                .with_for_update()
            )
            rows = (await conn.execute(stmt)).all()
            for row in rows:
                values: dict[str, Any] = {
                    "signing_secret": _reseal(ring, row.signing_secret, SIGNING_SECRET, everything),
                    "headers": {
                        name: _reseal(ring, value, HEADER_VALUE, everything)
                        for name, value in (row.headers or {}).items()
                    },
                }
                if row.previous_signing_secret is not None:
                    values["previous_signing_secret"] = _reseal(
                        ring, row.previous_signing_secret, SIGNING_SECRET, everything
                    )
                if any(values[name] != getattr(row, name) for name in values):
                    await conn.execute(update(targets).where(targets.c.id == row.id).values(**values))
                    changed += 1
        if len(rows) < BATCH:
            return changed
        after = rows[-1].id
