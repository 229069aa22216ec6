"""Idempotency keys: the first response to a (tenant, endpoint, key), kept for replay.

A key is claimed in the request's own transaction, before the work it guards. A concurrent
request with the same key blocks on the uncommitted row until that transaction ends: after
a commit it finds the stored response, after a rollback the row is gone and its own claim
goes through. Rows older than `IDEMPOTENCY_TTL` count as absent; the reaper deletes them
with `idempotency_key_purge_expired`.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, null, select, tuple_, update
from sqlalchemy.dialects.postgresql import insert

from app.db.async_engine import AsyncConnection
from app.store.tables import idempotency_keys

IDEMPOTENCY_TTL = dt.timedelta(hours=24)


@dataclass(frozen=True)
class IdempotencyRecord:
    """A committed key. `status_code` and `response` are None only if its request never recorded one."""

    request_hash: str
    status_code: int | None
    response: Any


def _key(tenant_id: uuid.UUID, endpoint: str, key: str) -> Any:
    return tuple_(idempotency_keys.c.tenant_id, idempotency_keys.c.endpoint, idempotency_keys.c.key) == (
        tenant_id,
        endpoint,
        key,
    )


async def idempotency_key_claim(
    conn: AsyncConnection,
    tenant_id: uuid.UUID,
    endpoint: str,
    key: str,
    request_hash: str,
) -> bool:
    """Inserts the key with no response yet; True if this transaction now owns it.

    An expired row is replaced in the same statement. False means a live row exists (and is
    row-locked until this transaction ends): read it with `idempotency_key_get`.
    """
    fresh = insert(idempotency_keys).values(tenant_id=tenant_id, endpoint=endpoint, key=key, request_hash=request_hash)
    stmt = fresh.on_conflict_do_update(
        index_elements=[idempotency_keys.c.tenant_id, idempotency_keys.c.endpoint, idempotency_keys.c.key],
        set_={
            "request_hash": fresh.excluded.request_hash,
            "status_code": null(),
            "response": null(),
            "created_at": func.now(),
        },
        where=idempotency_keys.c.created_at < func.now() - IDEMPOTENCY_TTL,
    ).returning(idempotency_keys.c.key)
    return (await conn.execute(stmt)).first() is not None


async def idempotency_key_get(
    conn: AsyncConnection, tenant_id: uuid.UUID, endpoint: str, key: str
) -> IdempotencyRecord | None:
    stmt = select(idempotency_keys.c.request_hash, idempotency_keys.c.status_code, idempotency_keys.c.response).where(
        _key(tenant_id, endpoint, key)
    )
    row = (await conn.execute(stmt)).mappings().one_or_none()
    if row is None:
        return None
    return IdempotencyRecord(row["request_hash"], row["status_code"], row["response"])


async def idempotency_key_record_response(
    conn: AsyncConnection, tenant_id: uuid.UUID, endpoint: str, key: str, status_code: int, response: Any
) -> None:
    """Stores the response of the request that claimed the key (in that request's transaction)."""
    stmt = (
        update(idempotency_keys)
        .where(_key(tenant_id, endpoint, key), idempotency_keys.c.status_code.is_(None))
        .values(status_code=status_code, response=response)
    )
    result = await conn.execute(stmt)
    if result.rowcount != 1:
        # The claim and this update run in one transaction that holds the row: anything else is a bug.
        raise RuntimeError(f"idempotency key of {endpoint} was not held by this transaction")


async def idempotency_key_purge_expired(
    conn: AsyncConnection, older_than: dt.timedelta = IDEMPOTENCY_TTL, limit: int = 1000
) -> int:
    """Deletes up to `limit` keys older than `older_than`, oldest first; returns how many.

    Rows locked by a request replacing them are skipped, so a purge never waits on the API.
    """
    expired = (
        select(idempotency_keys.c.tenant_id, idempotency_keys.c.endpoint, idempotency_keys.c.key)
        .where(idempotency_keys.c.created_at < func.now() - older_than)
        .order_by(idempotency_keys.c.created_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    stmt = delete(idempotency_keys).where(
        tuple_(idempotency_keys.c.tenant_id, idempotency_keys.c.endpoint, idempotency_keys.c.key).in_(expired)
    )
    result = await conn.execute(stmt)
    return int(result.rowcount)
