"""/v1/admin (admin key): API keys of every tenant, and per-tenant quota overrides and schedule
health defaults."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from pydantic import Field

from app.api.audit import request_id_of
from app.api.deps import Admin, Conn, QuotasDep, SettingsDep, TenantPath
from app.api.errors import Problem
from app.api.quotas import Quotas
from app.api.schemas.health import MAX_CONSECUTIVE_FAILURES, MAX_SUCCESS_WITHIN_S
from app.api.schemas.inputs import PlainText
from app.api.schemas.security import (
    ApiKeyCreate,
    ApiKeyCreated,
    ApiKeyPublic,
    TenantLimitsPublic,
    TenantLimitsUpdate,
)
from app.domain.health import TENANT_DEFAULT_FIELDS
from app.domain.quotas import LIMIT_FIELDS
from app.settings import Settings
from app.store.audit import audit_append
from app.store.quotas import tenant_limits_get, tenant_limits_set
from app.store.tenants import api_key_create_row, api_key_list, api_key_revoke, tenant_ensure, tenant_get_id

router = APIRouter(prefix="/v1/admin", tags=["admin"], dependencies=[Admin])


class TenantLimitsOverrides(TenantLimitsUpdate):
    """Per-tenant overrides (null or absent: the CRONHOOK_TENANT_* default), and the defaults
    of schedule health for the tenant's jobs that set no `expect` (null or absent: the
    CRONHOOK_EXPECT_* settings)."""

    expect_success_within_s: Annotated[int | None, Field(strict=True, ge=1, le=MAX_SUCCESS_WITHIN_S)] = Field(
        default=None, description="A recurring job is failing when no occurrence succeeded within this many seconds"
    )
    expect_max_consecutive_failures: Annotated[int | None, Field(strict=True, ge=1, le=MAX_CONSECUTIVE_FAILURES)] = (
        Field(default=None, description="A job is failing after this many failed occurrences in a row")
    )


TenantName = Annotated[PlainText | None, Query(min_length=1, max_length=200, description="Only this tenant's keys")]


async def _audit(conn: Conn, request: Request, tenant_id: uuid.UUID, action: str, object_id: object) -> None:
    await audit_append(
        conn,
        tenant_id=tenant_id,
        actor="admin",
        action=action,
        object_id=str(object_id),
        request_id=request_id_of(request),
    )


async def _existing_tenant(conn: Conn, name: str) -> uuid.UUID:
    tenant_id = await tenant_get_id(conn, name)
    if tenant_id is None:
        raise Problem(404, "tenant not found", slug="not-found", field="tenant")
    return tenant_id


@router.post("/tenants/{tenant}/api-keys", status_code=201, operation_id="adminCreateApiKey")
async def create_api_key(
    tenant: TenantPath, conn: Conn, request: Request, body: ApiKeyCreate | None = None
) -> ApiKeyCreated:
    """A new key for the tenant (created if new); the key is shown only in this response."""
    tenant_id = await tenant_ensure(conn, tenant)
    key, row = await api_key_create_row(conn, tenant_id, (body or ApiKeyCreate()).name)
    await _audit(conn, request, tenant_id, "adminCreateApiKey", row["id"])
    return ApiKeyCreated(**dict(row), key=key)


@router.get("/api-keys", operation_id="adminListApiKeys")
async def list_api_keys(conn: Conn, tenant: TenantName = None) -> list[ApiKeyPublic]:
    tenant_id = None if tenant is None else await _existing_tenant(conn, tenant)
    return [ApiKeyPublic.model_validate(dict(row)) for row in await api_key_list(conn, tenant_id)]


@router.post("/api-keys/{key_id}/revoke", operation_id="adminRevokeApiKey")
async def revoke_api_key(key_id: uuid.UUID, conn: Conn, request: Request) -> ApiKeyPublic:
    """Revokes the key at once on every replica (keys are looked up on every request)."""
    row = await api_key_revoke(conn, key_id)
    if row is None:
        raise Problem(404, "API key not found", slug="not-found")
    tenant_id = await tenant_get_id(conn, row["tenant"])
    assert tenant_id is not None
    await _audit(conn, request, tenant_id, "adminRevokeApiKey", key_id)
    return ApiKeyPublic.model_validate(dict(row))


async def _limits_public(
    conn: Conn, quotas: Quotas, settings: Settings, tenant: str, tenant_id: uuid.UUID
) -> TenantLimitsPublic:
    overrides: dict[str, Any] = await tenant_limits_get(conn, tenant_id)
    effective = dataclasses.asdict(await quotas.limits(conn, tenant_id))
    # Health defaults: the tenant's, else the settings' (a deadline may be none at all).
    for name in TENANT_DEFAULT_FIELDS:
        value = overrides.get(name)
        if (value := getattr(settings, name) if value is None else value) is not None:
            effective[name] = value
    return TenantLimitsPublic(
        tenant=tenant,
        effective=effective,
        overrides={name: overrides.get(name) for name in (*LIMIT_FIELDS, *TENANT_DEFAULT_FIELDS)},
    )


@router.get("/tenants/{tenant}/limits", operation_id="adminGetTenantLimits")
async def get_limits(tenant: TenantPath, conn: Conn, quotas: QuotasDep, settings: SettingsDep) -> TenantLimitsPublic:
    tenant_id = await _existing_tenant(conn, tenant)
    quotas.forget(tenant_id)
    return await _limits_public(conn, quotas, settings, tenant, tenant_id)


@router.put("/tenants/{tenant}/limits", operation_id="adminSetTenantLimits")
async def set_limits(
    tenant: TenantPath,
    body: TenantLimitsOverrides,
    conn: Conn,
    quotas: QuotasDep,
    settings: SettingsDep,
    request: Request,
) -> TenantLimitsPublic:
    """Replaces the tenant's overrides and health defaults (a field left out or null: the
    default applies). Other replicas apply a change of quotas within 5 s; the health watch
    applies new health defaults at its next pass."""
    tenant_id = await _existing_tenant(conn, tenant)
    await tenant_limits_set(conn, tenant_id, body.model_dump())
    quotas.forget(tenant_id)
    await _audit(conn, request, tenant_id, "adminSetTenantLimits", tenant)
    return await _limits_public(conn, quotas, settings, tenant, tenant_id)
