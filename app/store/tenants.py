"""Tenants and their API keys (stored as SHA-256 hashes only).

A key reads `chk_live_<id>_<random>_<checksum>`: the id and prefix are visible in listings
and to secret scanners, the CRC-32 checksum lets a typo or a made-up key be refused without
a database lookup. Authentication is one indexed lookup by hash per request, with no cache,
so a revocation holds on every replica at once.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets
import uuid
import zlib
from dataclasses import dataclass

from sqlalchemy import bindparam, func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.engine import RowMapping

from app.db.async_engine import AsyncConnection
from app.db.driver import DriverStatement, driver_fetch_one
from app.store.tables import api_keys, tenants

API_KEY_PREFIX = "chk_"
LIVE_KEY_PREFIX = "chk_live_"
BOOTSTRAP = "bootstrap"

KEY_COLUMNS = (
    api_keys.c.id,
    api_keys.c.key_prefix,
    api_keys.c.name,
    api_keys.c.kind,
    api_keys.c.created_at,
    api_keys.c.revoked_at,
    tenants.c.name.label("tenant"),
)


@dataclass(frozen=True)
class Caller:
    tenant_id: uuid.UUID
    api_key_id: uuid.UUID
    now: dt.datetime  # the database's clock when the key was checked


def hash_api_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _checksum(body: str) -> str:
    return f"{zlib.crc32(body.encode()):08x}"


def new_api_key(key_id: uuid.UUID) -> str:
    body = f"{LIVE_KEY_PREFIX}{key_id.hex[:12]}_{secrets.token_urlsafe(32).replace('_', 'x').replace('-', 'y')}"
    return f"{body}_{_checksum(body)}"


def visible_prefix(key: str) -> str:
    if key.startswith(LIVE_KEY_PREFIX):
        return key[: len(LIVE_KEY_PREFIX) + 12]
    return key[:8]


def plausible_api_key(key: str) -> bool:
    """False for a `chk_live_` key whose checksum does not match (a typo, a guess)."""
    if not key.startswith(LIVE_KEY_PREFIX):
        return True  # configured bootstrap keys and keys from before the checksum
    body, _, checksum = key.rpartition("_")
    return checksum == _checksum(body)


async def tenant_ensure(conn: AsyncConnection, name: str) -> uuid.UUID:
    stmt = insert(tenants).values(name=name).on_conflict_do_nothing(index_elements=["name"])
    await conn.execute(stmt)
    tenant_id: uuid.UUID | None = await conn.scalar(select(tenants.c.id).where(tenants.c.name == name))
    assert tenant_id is not None
    return tenant_id


async def tenant_get_id(conn: AsyncConnection, name: str) -> uuid.UUID | None:
    tenant_id: uuid.UUID | None = await conn.scalar(select(tenants.c.id).where(tenants.c.name == name))
    return tenant_id


async def api_key_create(conn: AsyncConnection, tenant_id: uuid.UUID, name: str | None = None) -> str:
    key, _ = await api_key_create_row(conn, tenant_id, name)
    return key


async def api_key_create_row(
    conn: AsyncConnection, tenant_id: uuid.UUID, name: str | None = None
) -> tuple[str, RowMapping]:
    """A new key (shown this once) and its listing row."""
    key_id = uuid.uuid4()
    key = new_api_key(key_id)
    await conn.execute(
        api_keys.insert().values(
            id=key_id, tenant_id=tenant_id, key_hash=hash_api_key(key), key_prefix=visible_prefix(key), name=name
        )
    )
    row = (
        await conn.execute(select(*KEY_COLUMNS).join_from(api_keys, tenants).where(api_keys.c.id == key_id))
    ).mappings()
    return key, row.one()


async def api_key_ensure(conn: AsyncConnection, tenant_id: uuid.UUID, key: str) -> None:
    stmt = (
        insert(api_keys)
        .values(tenant_id=tenant_id, key_hash=hash_api_key(key), key_prefix=visible_prefix(key))
        .on_conflict_do_nothing(index_elements=["key_hash"])
    )
    await conn.execute(stmt)


async def api_key_ensure_bootstrap(conn: AsyncConnection, tenant_id: uuid.UUID, key: str) -> int:
    """Ensures the configured bootstrap key and revokes every earlier one; returns how many.

    A key an operator revoked stays revoked even while still configured.
    """
    key_hash = hash_api_key(key)
    await conn.execute(
        insert(api_keys)
        .values(tenant_id=tenant_id, key_hash=key_hash, key_prefix=visible_prefix(key), kind=BOOTSTRAP)
        .on_conflict_do_update(index_elements=["key_hash"], set_={"kind": BOOTSTRAP})
    )
    retired = await conn.execute(
        update(api_keys)
        .where(api_keys.c.kind == BOOTSTRAP, api_keys.c.key_hash != key_hash, api_keys.c.revoked_at.is_(None))
        .values(revoked_at=func.now())
        .returning(api_keys.c.id)
    )
    return len(retired.all())


async def api_key_authenticate(conn: AsyncConnection, key: str) -> uuid.UUID | None:
    """The tenant owning this key, or None for an unknown or revoked key."""
    caller = await api_key_caller(conn, key)
    return None if caller is None else caller.tenant_id


# Built once (every request runs it). The database's now() comes with the answer, so a
# create needs no round trip of its own for the clock.
_AUTHENTICATE = select(api_keys.c.tenant_id, api_keys.c.id, func.now().label("now")).where(
    api_keys.c.key_hash == bindparam("key_hash"), api_keys.c.revoked_at.is_(None)
)


API_KEY_AUTHENTICATE = DriverStatement(_AUTHENTICATE)


async def api_key_caller(conn: AsyncConnection, key: str) -> Caller | None:
    """The tenant and key id of this key with the database's now(), or None for an unknown or
    revoked key. Never cached: a revocation holds for the next request on every replica."""
    row = await driver_fetch_one(conn, API_KEY_AUTHENTICATE, {"key_hash": hash_api_key(key)})
    return None if row is None else Caller(row["tenant_id"], row["id"], row["now"])


async def api_key_tenant(conn: AsyncConnection, key_hash: str) -> uuid.UUID | None:
    """The tenant of a live key, by hash (the request-rate refill; authentication is above)."""
    stmt = select(api_keys.c.tenant_id).where(api_keys.c.key_hash == key_hash, api_keys.c.revoked_at.is_(None))
    tenant_id: uuid.UUID | None = await conn.scalar(stmt)
    return tenant_id


async def api_key_list(conn: AsyncConnection, tenant_id: uuid.UUID | None) -> list[RowMapping]:
    stmt = select(*KEY_COLUMNS).join_from(api_keys, tenants).order_by(api_keys.c.created_at, api_keys.c.id)
    if tenant_id is not None:
        stmt = stmt.where(api_keys.c.tenant_id == tenant_id)
    return list((await conn.execute(stmt)).mappings().all())


async def api_key_revoke(conn: AsyncConnection, key_id: uuid.UUID) -> RowMapping | None:
    """Revokes the key (at once, on every replica: nothing caches keys); None if unknown.
    Revoking a revoked key is a no-op that returns it."""
    await conn.execute(
        update(api_keys).where(api_keys.c.id == key_id, api_keys.c.revoked_at.is_(None)).values(revoked_at=func.now())
    )
    stmt = select(*KEY_COLUMNS).join_from(api_keys, tenants).where(api_keys.c.id == key_id)
    return (await conn.execute(stmt)).mappings().one_or_none()
