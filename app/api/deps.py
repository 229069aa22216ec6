"""Request dependencies: settings, a per-request connection, and the authenticated tenant.

All of them are `async def`: a plain `def` dependency would hop through the thread pool on
every request. The first statement of every authenticated request is the key look-up, a read:
a pooled connection found dead there (no pre-ping, see app/db/engine.py) is replaced and the
look-up tried once more, so a database restart costs no request an error.
"""

from __future__ import annotations

import hmac
import uuid
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.api.errors import Problem
from app.api.idempotency import HEADER as IDEMPOTENCY_HEADER
from app.settings import Settings
from app.store.tenants import KeyMatch, api_key_authenticate_at

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
    async with engine.connect() as conn:
        yield conn
        await conn.commit()


async def get_create_conn(
    request: Request, engine: Annotated[AsyncEngine, Depends(get_engine)]
) -> AsyncIterator[AsyncConnection]:
    """POST /v1/jobs: without an Idempotency-Key the create is one statement (app/store/
    job_inserts.py), run in autocommit, which spares the BEGIN and COMMIT round trips; with a
    key, the key's claim, the job and the stored response share one transaction."""
    async with engine.connect() as conn:
        if IDEMPOTENCY_HEADER not in request.headers:
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            yield conn
            return
        yield conn
        await conn.commit()


# scope="function": the transaction commits before the response is sent, so a client never
# holds a 201 for a row whose commit then failed.
Conn = Annotated[AsyncConnection, Depends(get_conn, scope="function")]
CreateConn = Annotated[AsyncConnection, Depends(get_create_conn, scope="function")]
SettingsDep = Annotated[Settings, Depends(get_settings)]
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]

_UNAUTHORIZED = {"WWW-Authenticate": 'Bearer realm="cronhook"'}


async def _authenticate(conn: AsyncConnection, credentials: HTTPAuthorizationCredentials | None) -> KeyMatch:
    if credentials is None or not credentials.credentials:
        raise Problem(
            401,
            "missing API key: send `Authorization: Bearer <key>`",
            slug="unauthorized",
            headers=_UNAUTHORIZED,
        )
    try:
        match = await api_key_authenticate_at(conn, credentials.credentials)
    except DBAPIError as exc:
        if not exc.connection_invalidated:
            raise
        # The pooled connection was dead (the database restarted). Nothing was done on it
        # yet: end its transaction, which lets the next statement take a fresh connection
        # (keeping this connection's isolation level), and ask again.
        assert conn.sync_connection is not None
        level = conn.sync_connection.get_execution_options().get("isolation_level")
        await conn.rollback()
        if level is not None:
            await conn.execution_options(isolation_level=level)
        match = await api_key_authenticate_at(conn, credentials.credentials)
    if match is None:
        raise Problem(401, "invalid API key", slug="unauthorized", headers=_UNAUTHORIZED)
    return match


async def require_tenant(conn: Conn, credentials: Credentials) -> uuid.UUID:
    return (await _authenticate(conn, credentials)).tenant_id


async def require_caller(conn: Conn, credentials: Credentials) -> KeyMatch:
    """The tenant, with the database's now() (the transaction's) to plan jobs against."""
    return await _authenticate(conn, credentials)


async def require_creator(conn: CreateConn, credentials: Credentials) -> KeyMatch:
    """The tenant of a create request, with the database's now() to plan the job against."""
    return await _authenticate(conn, credentials)


TenantId = Annotated[uuid.UUID, Depends(require_tenant)]
Caller = Annotated[KeyMatch, Depends(require_caller)]
Creator = Annotated[KeyMatch, Depends(require_creator)]


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
