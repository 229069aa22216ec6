"""Request dependencies: settings, a per-request transaction, and the authenticated tenant."""

from __future__ import annotations

import hmac
import uuid
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.api.errors import Problem
from app.settings import Settings
from app.store.tenants import api_key_authenticate

_bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer chk_...`")


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_engine(request: Request) -> AsyncEngine:
    engine: AsyncEngine = request.app.state.engine
    return engine


async def get_conn(engine: Annotated[AsyncEngine, Depends(get_engine)]) -> AsyncIterator[AsyncConnection]:
    # One transaction per request: an error anywhere rolls everything back.
    async with engine.begin() as conn:
        yield conn


# scope="function": the transaction commits before the response is sent, so a client never
# holds a 201 for a row whose commit then failed.
Conn = Annotated[AsyncConnection, Depends(get_conn, scope="function")]
SettingsDep = Annotated[Settings, Depends(get_settings)]

_UNAUTHORIZED = {"WWW-Authenticate": 'Bearer realm="cronhook"'}


async def require_tenant(
    conn: Conn, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> uuid.UUID:
    if credentials is None or not credentials.credentials:
        raise Problem(
            401,
            "missing API key: send `Authorization: Bearer <key>`",
            slug="unauthorized",
            headers=_UNAUTHORIZED,
        )
    tenant_id = await api_key_authenticate(conn, credentials.credentials)
    if tenant_id is None:
        raise Problem(401, "invalid API key", slug="unauthorized", headers=_UNAUTHORIZED)
    return tenant_id


TenantId = Annotated[uuid.UUID, Depends(require_tenant)]


async def require_admin(
    settings: SettingsDep, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
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
