"""Request dependencies: settings, a per-request connection, the authenticated caller (with
its request rate and failed-auth throttling, app/api/quotas.py) and the audit record of a
mutation (app/api/audit.py).

All of them are `async def`: a plain `def` dependency would hop through the thread pool on
every request. The first statement of every authenticated request is the key look-up, a read:
a pooled connection found dead there (no pre-ping, see app/db/engine.py) is replaced and the
look-up tried once more, so a database restart costs no request an error.
"""

from __future__ import annotations

import hmac
import math
import uuid
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Path, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.types import Scope

from app.api.errors import Problem
from app.api.idempotency import HEADER as IDEMPOTENCY_HEADER
from app.api.quotas import Quotas
from app.api.schemas.inputs import PlainText, label_filter
from app.db.async_engine import AsyncConnection, AsyncEngine
from app.db.errors import once_more_if_dead
from app.db.watch import DB_WATCH
from app.keyring import KeyRing
from app.settings import Settings
from app.store.tenants import Caller, api_key_caller, plausible_api_key

_bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer chk_...`")


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_engine(request: Request) -> AsyncEngine:
    engine: AsyncEngine = request.app.state.engine
    return engine


async def get_conn(engine: Annotated[AsyncEngine, Depends(get_engine)]) -> AsyncIterator[AsyncConnection]:
    # One transaction per request: an error anywhere rolls everything back (closing the
    # connection without a commit).
    # Watched (app/db/watch.py): a request whose database work does not return is a stall.
    with DB_WATCH.operation("api_request"):
        async with engine.connect() as conn:
            yield conn
            await conn.commit()


async def get_create_conn(
    request: Request, engine: Annotated[AsyncEngine, Depends(get_engine)]
) -> AsyncIterator[AsyncConnection]:
    """POST /v1/jobs: without an Idempotency-Key the create is one statement (app/store/
    job_inserts.py), run in autocommit, which spares the BEGIN and COMMIT round trips; with a
    key, the key's claim, the job and the stored response share one transaction."""
    with DB_WATCH.operation("api_create"):
        async with engine.connect() as conn:
            if IDEMPOTENCY_HEADER not in request.headers:
                await conn.execution_options(isolation_level="AUTOCOMMIT")
                yield conn
                return
            yield conn
            await conn.commit()


async def get_autocommit_conn(engine: Annotated[AsyncEngine, Depends(get_engine)]) -> AsyncIterator[AsyncConnection]:
    """A connection in autocommit, for routes whose usual work is one statement, atomic on its
    own (a receiver's report: app/api/routes/completions.py): no BEGIN and COMMIT round
    trips. A route that needs a transaction after all calls `in_transaction` first."""
    with DB_WATCH.operation("api_request"):
        async with engine.connect() as conn:
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            yield conn


async def in_transaction(conn: AsyncConnection) -> None:
    """Switches an autocommit connection (get_autocommit_conn) to transactions: what it runs
    next is one transaction, committed by the caller (or rolled back when the request fails)."""
    await conn.commit()  # ends the logical transaction autocommit keeps, so the level may change
    await conn.execution_options(isolation_level="READ COMMITTED")


# scope="function": the transaction commits before the response is sent, so a client never
# holds a 201 for a row whose commit then failed.
Conn = Annotated[AsyncConnection, Depends(get_conn, scope="function")]
CreateConn = Annotated[AsyncConnection, Depends(get_create_conn, scope="function")]
AutocommitConn = Annotated[AsyncConnection, Depends(get_autocommit_conn, scope="function")]
SettingsDep = Annotated[Settings, Depends(get_settings)]
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


async def get_quotas(request: Request) -> Quotas:
    quotas: Quotas = request.app.state.quotas
    return quotas


QuotasDep = Annotated[Quotas, Depends(get_quotas)]


async def get_key_ring(request: Request) -> KeyRing:
    key_ring: KeyRing = request.app.state.key_ring
    return key_ring


# Seals and opens target secrets (the process's ring, loaded once: app/api/app.py).
KeyRingDep = Annotated[KeyRing, Depends(get_key_ring)]


def too_many(detail: str, wait_s: float, slug: str) -> Problem:
    """A 429 with Retry-After in whole seconds (at least 1)."""
    return Problem(429, detail, slug=slug, headers={"Retry-After": str(max(1, math.ceil(wait_s)))})


_UNAUTHORIZED = {"WWW-Authenticate": 'Bearer realm="cronhook"'}


def client_address(scope: Scope) -> str:
    """Where a request came from: what failed authentications are counted against."""
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


async def admit_request(request: Request, quotas: QuotasDep, credentials: Credentials) -> str:
    """The API key, once its address and tenant may send another request (else 429).

    Runs before the request's connection is taken (see Quotas.admit)."""
    if credentials is None or not credentials.credentials:
        raise Problem(
            401,
            "missing API key: send `Authorization: Bearer <key>`",
            slug="unauthorized",
            headers=_UNAUTHORIZED,
        )
    if (wait_s := quotas.auth_wait(client_address(request.scope))) is not None:
        raise too_many("too many failed authentications from this address", wait_s, "auth-throttled")
    key = credentials.credentials
    await admit_key(quotas, key)
    return key


async def admit_key(quotas: Quotas, key: str) -> None:
    """429 unless the key's tenant may send another request (a key that cannot be one passes:
    authentication refuses it next)."""
    if plausible_api_key(key) and (wait_s := await quotas.admit(key)) is not None:
        raise too_many("request rate limit exceeded for this tenant", wait_s, "rate-limited")


AdmittedKey = Annotated[str, Depends(admit_request)]


async def _lookup(conn: AsyncConnection, key: str) -> Caller | None:
    # One indexed lookup by hash on every request, no cache: a revoked key fails at once.
    if not plausible_api_key(key):
        return None
    return await once_more_if_dead(lambda: api_key_caller(conn, key), lambda: fresh_connection(conn))


async def fresh_connection(conn: AsyncConnection) -> None:
    """After a statement found `conn`'s pooled connection dead: ends its transaction, which
    lets the next statement take a fresh connection, keeping this connection's isolation
    level."""
    assert conn.sync_connection is not None
    level = conn.sync_connection.get_execution_options().get("isolation_level")
    await conn.rollback()
    if level is not None:
        await conn.execution_options(isolation_level=level)


async def authenticate(address: str, conn: AsyncConnection, key: str, quotas: Quotas) -> Caller:
    """The caller of this key (401 for an unknown or revoked one, counted against `address`)."""
    caller = await _lookup(conn, key)
    if caller is None:
        quotas.auth_failed(address)
        raise Problem(401, "invalid API key", slug="unauthorized", headers=_UNAUTHORIZED)
    return caller


async def _authenticate(request: Request, conn: AsyncConnection, key: str, quotas: Quotas) -> Caller:
    caller = await authenticate(client_address(request.scope), conn, key, quotas)
    request.state.caller = caller
    return caller


async def require_caller(request: Request, key: AdmittedKey, conn: Conn, quotas: QuotasDep) -> Caller:
    """The tenant and key, with the database's now() (the transaction's) to plan jobs against."""
    return await _authenticate(request, conn, key, quotas)


async def require_creator(request: Request, key: AdmittedKey, conn: CreateConn, quotas: QuotasDep) -> Caller:
    """The caller of a create request, with the database's now() to plan the job against."""
    return await _authenticate(request, conn, key, quotas)


async def require_tenant(caller: Annotated[Caller, Depends(require_caller)]) -> uuid.UUID:
    return caller.tenant_id


TenantId = Annotated[uuid.UUID, Depends(require_tenant)]
CallerDep = Annotated[Caller, Depends(require_caller)]
CreatorDep = Annotated[Caller, Depends(require_creator)]


async def require_admin(settings: SettingsDep, credentials: Credentials) -> None:
    """Operator endpoints take `CRONHOOK_ADMIN_API_KEY`, never a tenant's key."""
    configured = settings.admin_api_key
    if configured is None:
        raise Problem(403, "the admin API is disabled: set CRONHOOK_ADMIN_API_KEY to enable it", slug="forbidden")
    if credentials is None or not credentials.credentials:
        raise Problem(
            401, "missing admin key: send `Authorization: Bearer <key>`", slug="unauthorized", headers=_UNAUTHORIZED
        )
    if not hmac.compare_digest(credentials.credentials.encode(), configured.get_secret_value().encode()):
        raise Problem(403, "this endpoint needs the admin key", slug="forbidden")


Admin = Depends(require_admin)


async def label_selectors(
    label: Annotated[
        list[str] | None,
        Query(description="key=value: only what carries this label (repeatable: every one must hold)"),
    ] = None,
) -> dict[str, str] | None:
    try:
        return label_filter(label)
    except ValueError as exc:
        raise Problem(422, str(exc), slug="validation", field="label") from None


LabelFilter = Annotated[dict[str, str] | None, Depends(label_selectors)]

# A tenant named in an admin path (`/v1/admin/tenants/{tenant}/...`): its name as given to
# `cronhook api-key create` or the admin API, plain text (a NUL would fail in the database).
TenantPath = Annotated[PlainText, Path(min_length=1, max_length=200, description="The tenant's name")]
