"""API keys, tenant quotas and the audit log: public models and admin inputs."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Annotated

from pydantic import BaseModel, Field

from app.api.schemas.inputs import PlainText, RequestModel


class ApiKeyPublic(BaseModel):
    id: uuid.UUID
    tenant: str
    key_prefix: str = Field(
        description="The visible start of the key (`chk_live_<id>`); the key itself is never shown again"
    )
    name: str | None
    kind: str = Field(description="`tenant`, or `bootstrap` for CRONHOOK_BOOTSTRAP_API_KEY")
    created_at: dt.datetime
    revoked_at: dt.datetime | None


class ApiKeyCreated(ApiKeyPublic):
    key: str = Field(description="The API key; shown only in this response")


class ApiKeyCreate(RequestModel):
    name: Annotated[PlainText | None, Field(max_length=200)] = None


class TenantLimitsUpdate(RequestModel):
    """Per-tenant overrides; null (or absent) = the CRONHOOK_TENANT_* default."""

    requests_per_s: Annotated[float | None, Field(strict=True, ge=0, le=1_000_000)] = None
    max_active_jobs: Annotated[int | None, Field(strict=True, ge=1, le=100_000_000)] = None
    max_targets: Annotated[int | None, Field(strict=True, ge=1, le=1_000_000)] = None
    min_interval_s: Annotated[int | None, Field(strict=True, ge=1, le=86_400)] = None
    min_backoff_base_s: Annotated[float | None, Field(strict=True, ge=0, le=86_400)] = None
    max_attempts: Annotated[int | None, Field(strict=True, ge=1, le=100)] = None


class TenantLimitsPublic(BaseModel):
    tenant: str
    effective: dict[str, float | int] = Field(description="The limits that apply (defaults with overrides)")
    overrides: dict[str, float | int | None] = Field(description="This tenant's overrides; null = default")


class AuditEntry(BaseModel):
    id: int
    api_key_id: uuid.UUID | None = Field(description="The API key used; null for the admin key or the CLI")
    actor: str = Field(description="`api_key`, `admin` or `cli`")
    action: str = Field(description="The operation (its operationId, e.g. `createJob`)")
    object_id: str | None
    request_id: str | None
    created_at: dt.datetime
