"""/v1/targets: where webhooks go, and the secrets they are signed with."""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response

from app.api.audit import Audited, set_audit_object
from app.api.deps import Conn, KeyRingDep, QuotasDep, SettingsDep, TenantId
from app.api.errors import Problem
from app.api.idempotency import REPLAYED_RESPONSE_DOC, IdempotencyKey, IdempotentRequest
from app.api.schemas.pages import Page, page_of
from app.api.schemas.targets import (
    TargetCreate,
    TargetPublic,
    TargetRotate,
    TargetSecret,
    TargetUpdate,
    TargetWithSecret,
    target_public,
)
from app.services.egress_resolver import url_refusal
from app.settings import Settings
from app.store import targets as store
from app.store.pagination import decode_time_id_cursor
from app.store.quotas import tenant_count_targets

router = APIRouter(prefix="/v1/targets", tags=["targets"], dependencies=[Audited])

NOT_FOUND = "target not found"


async def _check_egress(settings: Settings, url: str | None) -> None:
    """Refuse internal destinations now, with a clear 422; delivery checks again (DNS changes)."""
    if url is not None and (refusal := await url_refusal(settings.egress_policy, url)) is not None:
        raise Problem(422, refusal, slug="validation", field="url")


def _check_timeout(settings: Settings, timeout_s: float | None) -> None:
    if timeout_s is not None and timeout_s > settings.max_target_timeout_s:
        raise Problem(
            422,
            f"must be at most {settings.max_target_timeout_s:g} (CRONHOOK_MAX_TARGET_TIMEOUT_S)",
            slug="validation",
            field="timeout_s",
        )


@router.post("", status_code=201, operation_id="createTarget", responses=REPLAYED_RESPONSE_DOC)
async def create_target(
    body: TargetCreate,
    tenant_id: TenantId,
    conn: Conn,
    settings: SettingsDep,
    quotas: QuotasDep,
    key_ring: KeyRingDep,
    request: Request,
    response: Response,
    idempotency_key: IdempotencyKey = None,
) -> TargetWithSecret:
    idempotent = IdempotentRequest(conn, tenant_id, "POST /v1/targets", idempotency_key, body)
    if (replay := await idempotent.begin()) is not None:
        # Stored without the secret; the replay carries the target's current one.
        replayed = TargetPublic.model_validate(replay.apply(response))
        current_secret = await store.target_get_signing_secret(conn, key_ring, tenant_id, replayed.id)
        return TargetWithSecret(**replayed.model_dump(), secret=current_secret)
    _check_timeout(settings, body.timeout_s)
    await _check_egress(settings, body.url)
    limits = await quotas.limits(conn, tenant_id)
    if await tenant_count_targets(conn, tenant_id) >= limits.max_targets:
        raise Problem(
            409,
            f"this tenant already has {limits.max_targets} targets, its limit",
            slug="quota-exceeded",
            extra={"limit": "max_targets", "max_targets": limits.max_targets},
        )
    row, secret = await store.target_create(
        conn,
        key_ring,
        tenant_id,
        name=body.name,
        url=body.url,
        headers=body.headers or {},
        timeout_s=body.timeout_s or settings.default_target_timeout_s,
        retry_on_status=body.retry_on_status,
        max_in_flight=body.max_in_flight,
        rate_per_s=body.rate_per_s,
        completion=body.model_dump(
            include={"completion", "async_timeout_s", "heartbeat_timeout_s", "async_counts_in_flight"},
            exclude_none=True,
        ),
    )
    created = TargetWithSecret(**target_public(row).model_dump(), secret=secret)
    set_audit_object(request, created.id)
    await idempotent.finish(201, created, exclude={"secret"})
    return created


@router.get("", operation_id="listTargets")
async def list_targets(
    tenant_id: TenantId,
    conn: Conn,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: str | None = None,
) -> Page[TargetPublic]:
    after = decode_time_id_cursor(cursor) if cursor else None
    rows = await store.target_list(conn, tenant_id, limit + 1, after)
    return page_of(rows, limit, target_public)


@router.get("/{target_id}", operation_id="getTarget")
async def get_target(target_id: uuid.UUID, tenant_id: TenantId, conn: Conn) -> TargetPublic:
    row = await store.target_get(conn, tenant_id, target_id)
    if row is None:
        raise Problem(404, NOT_FOUND, slug="not-found")
    return target_public(row)


@router.patch("/{target_id}", operation_id="updateTarget")
async def update_target(
    target_id: uuid.UUID,
    body: TargetUpdate,
    tenant_id: TenantId,
    conn: Conn,
    settings: SettingsDep,
    key_ring: KeyRingDep,
) -> TargetPublic:
    changes: dict[str, Any] = body.model_dump(exclude_unset=True)
    for field in ("name", "url", "timeout_s", "completion", "async_counts_in_flight"):
        if field in changes and changes[field] is None:
            raise Problem(422, "must not be null", slug="validation", field=field)
    if "headers" in changes and changes["headers"] is None:
        changes["headers"] = {}
    _check_timeout(settings, changes.get("timeout_s"))
    await _check_egress(settings, changes.get("url"))
    if not changes:
        row = await store.target_get(conn, tenant_id, target_id)
    else:
        row = await store.target_update(conn, key_ring, tenant_id, target_id, changes)
    if row is None:
        raise Problem(404, NOT_FOUND, slug="not-found")
    return target_public(row)


@router.delete("/{target_id}", status_code=204, operation_id="deleteTarget")
async def delete_target(target_id: uuid.UUID, tenant_id: TenantId, conn: Conn) -> Response:
    if not await store.target_lock_for_delete(conn, tenant_id, target_id):
        raise Problem(404, NOT_FOUND, slug="not-found")
    active = await store.target_count_active_jobs(conn, target_id)
    if active:
        raise Problem(
            409,
            f"target has {active} active job(s); cancel them first",
            slug="target-in-use",
            extra={"active_jobs": active},
        )
    await store.target_delete(conn, tenant_id, target_id)
    return Response(status_code=204)


@router.post("/{target_id}/rotate-secret", operation_id="rotateTargetSecret")
async def rotate_secret(
    target_id: uuid.UUID, tenant_id: TenantId, conn: Conn, key_ring: KeyRingDep, body: TargetRotate | None = None
) -> TargetSecret:
    """A new signing secret. The previous one keeps signing alongside it (a second signature
    in `webhook-signature`) for `grace_s` seconds, so receivers can switch without dropping
    deliveries."""
    grace_s = (body or TargetRotate()).grace_s
    secret = await store.target_rotate_secret(conn, key_ring, tenant_id, target_id, grace_s)
    if secret is None:
        raise Problem(404, NOT_FOUND, slug="not-found")
    return TargetSecret(id=target_id, secret=secret)
