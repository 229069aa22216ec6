"""Tenants and their API keys (stored as SHA-256 hashes only)."""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets
import uuid
from dataclasses import dataclass

from sqlalchemy import bindparam, func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from app.store.tables import api_keys, tenants

API_KEY_PREFIX = "chk_"


def hash_api_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_api_key() -> str:
    return API_KEY_PREFIX + secrets.token_urlsafe(32)


async def tenant_ensure(conn: AsyncConnection, name: str) -> uuid.UUID:
    stmt = insert(tenants).values(name=name).on_conflict_do_nothing(index_elements=["name"])
    await conn.execute(stmt)
    tenant_id: uuid.UUID | None = await conn.scalar(select(tenants.c.id).where(tenants.c.name == name))
    assert tenant_id is not None
    return tenant_id


async def api_key_create(conn: AsyncConnection, tenant_id: uuid.UUID) -> str:
    key = new_api_key()
    await api_key_ensure(conn, tenant_id, key)
    return key


async def api_key_ensure(conn: AsyncConnection, tenant_id: uuid.UUID, key: str) -> None:
    stmt = (
        insert(api_keys)
        .values(tenant_id=tenant_id, key_hash=hash_api_key(key), key_prefix=key[:8])
        .on_conflict_do_nothing(index_elements=["key_hash"])
    )
    await conn.execute(stmt)


# Built once (every request runs it). The database's now() comes with the answer, so a
# create needs no round trip of its own for the clock.
_AUTHENTICATE = select(api_keys.c.tenant_id, func.now().label("now")).where(
    api_keys.c.key_hash == bindparam("key_hash"), api_keys.c.revoked_at.is_(None)
)


@dataclass(frozen=True)
class KeyMatch:
    tenant_id: uuid.UUID
    now: dt.datetime  # the database's clock when the key was checked


async def api_key_authenticate_at(conn: AsyncConnection, key: str) -> KeyMatch | None:
    """The tenant owning this key and the database's now(), or None for an unknown or revoked
    key. Never cached: a revocation holds for the next request on every replica."""
    row = (await conn.execute(_AUTHENTICATE, {"key_hash": hash_api_key(key)})).one_or_none()
    return None if row is None else KeyMatch(row.tenant_id, row.now)


async def api_key_authenticate(conn: AsyncConnection, key: str) -> uuid.UUID | None:
    """The tenant owning this key, or None for an unknown or revoked key."""
    match = await api_key_authenticate_at(conn, key)
    return None if match is None else match.tenant_id
