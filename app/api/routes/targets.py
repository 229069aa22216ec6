"""/v1/targets: where webhooks go, and the secrets they are signed with; a target put (created
or changed, idempotently) and read by its name under /v1/targets/by-name/{name}. HTTP only:
creating, changing and putting a target is app/api/target_upserts.py."""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query, Request, Response
from fastapi.responses import JSONResponse

from app.api import target_upserts
from app.api.audit import Audited, set_audit_object
from app.api.deps import Conn, KeyRingDep, LabelFilter, QuotasDep, SettingsDep, TenantId
from app.api.errors import Problem
from app.api.idempotency import REPLAYED_RESPONSE_DOC, IdempotencyKey, IdempotentRequest
from app.api.schemas.inputs import PlainText
from app.api.schemas.pages import Page, page_of
from app.api.schemas.targets import (
    NamedTarget,
    NamedTargetWithSecret,
    TargetCreate,
    TargetDefinition,
    TargetPublic,
    TargetRotate,
    TargetSecret,
    TargetUpdate,
    TargetWithSecret,
    target_public,
)
from app.store import targets as store
from app.store.pagination import decode_time_id_cursor

router = APIRouter(prefix="/v1/targets", tags=["targets"], dependencies=[Audited])

# `:path`: a name may hold a `/` (sent as is or as %2F), as POST /v1/targets allows.
NamePath = Annotated[
    PlainText,
    Path(min_length=1, max_length=200, description="The target's name, as POST /v1/targets takes it"),
]
_ETAG_HEADER = {
    "ETag": {"description": "The target's definition: send it back in If-Match", "schema": {"type": "string"}}
}


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
    row, secret = await target_upserts.create_target(conn, key_ring, settings, quotas, tenant_id, body.name, body)
    created = TargetWithSecret(**target_public(row).model_dump(), secret=secret)
    set_audit_object(request, created.id)
    await idempotent.finish(201, created, exclude={"secret"})
    return created


# Before the /{target_id} routes, which would take "by-name" for an id (and refuse it, 422).
@router.put(
    "/by-name/{name:path}",
    operation_id="putTargetByName",
    response_model=NamedTarget,
    responses={200: {"headers": _ETAG_HEADER}, 201: {"model": NamedTargetWithSecret, "headers": _ETAG_HEADER}},
)
async def put_target_by_name(
    name: NamePath,
    body: TargetDefinition,
    request: Request,
    tenant_id: TenantId,
    conn: Conn,
    settings: SettingsDep,
    quotas: QuotasDep,
    key_ring: KeyRingDep,
    if_match: Annotated[str | None, Header(description="Change only if the target has this ETag")] = None,
    if_none_match: Annotated[str | None, Header(description="`*`: create only, if no target has the name")] = None,
) -> Any:
    """Creates the target named `name` (201, with its signing secret, shown this once) or makes
    it match this body (200): a body that changes nothing writes nothing; one that does changes
    those fields as PATCH would, and never the secret. The body is a create's, without `name`;
    a field left out takes its default. 409 while several live targets have the name."""
    done = await target_upserts.put_target(
        conn, key_ring, settings, quotas, tenant_id, name, body, (if_match, if_none_match)
    )
    set_audit_object(request, done.row["id"])
    shown = NamedTarget(**target_public(done.row).model_dump(), changed=done.changed)
    if done.secret is not None:
        shown = NamedTargetWithSecret(**shown.model_dump(), secret=done.secret)
    return JSONResponse(
        shown.model_dump(mode="json"),
        status_code=201 if done.created else 200,
        headers={"ETag": target_upserts.etag(done.row, key_ring)},
    )


@router.get(
    "/by-name/{name:path}",
    operation_id="getTargetByName",
    response_model=TargetPublic,
    responses={200: {"headers": _ETAG_HEADER}},
)
async def get_target_by_name(name: NamePath, tenant_id: TenantId, conn: Conn, key_ring: KeyRingDep) -> Any:
    """The target named `name` (404 if none; 409 while several live targets have the name)."""
    row = await target_upserts.named_target(conn, tenant_id, name)
    return JSONResponse(
        target_public(row).model_dump(mode="json"), headers={"ETag": target_upserts.etag(row, key_ring)}
    )


@router.get("", operation_id="listTargets")
async def list_targets(
    tenant_id: TenantId,
    conn: Conn,
    labels: LabelFilter = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: str | None = None,
) -> Page[TargetPublic]:
    after = decode_time_id_cursor(cursor) if cursor else None
    rows = await store.target_list(conn, tenant_id, limit + 1, after, labels)
    return page_of(rows, limit, target_public)


@router.get("/{target_id}", operation_id="getTarget")
async def get_target(target_id: uuid.UUID, tenant_id: TenantId, conn: Conn) -> TargetPublic:
    row = await store.target_get(conn, tenant_id, target_id)
    if row is None:
        raise Problem(404, target_upserts.NOT_FOUND, slug="not-found")
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
    return target_public(await target_upserts.change_target(conn, key_ring, settings, tenant_id, target_id, body))


@router.delete("/{target_id}", status_code=204, operation_id="deleteTarget")
async def delete_target(target_id: uuid.UUID, tenant_id: TenantId, conn: Conn) -> Response:
    if not await store.target_lock_for_delete(conn, tenant_id, target_id):
        raise Problem(404, target_upserts.NOT_FOUND, slug="not-found")
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
        raise Problem(404, target_upserts.NOT_FOUND, slug="not-found")
    return TargetSecret(id=target_id, secret=secret)
