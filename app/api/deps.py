"""Request dependencies: settings, a per-request transaction, the authenticated tenant (with
its request rate and failed-auth throttling, app/api/quotas.py) and the audit record of a
mutation (app/api/audit.py)."""

from __future__ import annotations

import hmac
import math
import uuid
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.api.errors import Problem
from app.api.quotas import Quotas
from app.settings import Settings
from app.store.tenants import api_key_caller, plausible_api_key

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


def get_quotas(request: Request) -> Quotas:
    quotas: Quotas = request.app.state.quotas
    return quotas


QuotasDep = Annotated[Quotas, Depends(get_quotas)]


def _too_many(detail: str, wait_s: float, slug: str) -> Problem:
    return Problem(429, detail, slug=slug, headers={"Retry-After": str(max(1, math.ceil(wait_s)))})


_UNAUTHORIZED = {"WWW-Authenticate": 'Bearer realm="cronhook"'}


def _address(request: Request) -> str:
    return request.client.host if request.client else "unknown"


async def admit_request(
    request: Request, quotas: QuotasDep, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> str:
    """The API key, once its address and tenant may send another request (else 429).

    Runs before the request's connection is taken (see Quotas.admit)."""
    if credentials is None or not credentials.credentials:
        raise Problem(
            401,
            "missing API key: send `Authorization: Bearer <key>`",
            slug="unauthorized",
            headers=_UNAUTHORIZED,
        )
    if (wait_s := quotas.auth_wait(_address(request))) is not None:
        raise _too_many("too many failed authentications from this address", wait_s, "auth-throttled")
    key = credentials.credentials
    if plausible_api_key(key) and (wait_s := await quotas.admit(key)) is not None:
        raise _too_many("request rate limit exceeded for this tenant", wait_s, "rate-limited")
    return key


async def require_tenant(
    request: Request, key: Annotated[str, Depends(admit_request)], conn: Conn, quotas: QuotasDep
) -> uuid.UUID:
    # One indexed lookup by hash on every request, no cache: a revoked key fails at once.
    caller = await api_key_caller(conn, key) if plausible_api_key(key) else None
    if caller is None:
        quotas.auth_failed(_address(request))
        raise Problem(401, "invalid API key", slug="unauthorized", headers=_UNAUTHORIZED)
    request.state.caller = caller
    return caller.tenant_id


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
