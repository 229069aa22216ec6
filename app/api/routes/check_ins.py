"""/v1/checks: inbound check-ins (app/domain/check_ins.py), a dead-man's switch for a cron
cronhook does not run; and /v1/checks/ping/{token}[/start|/fail], where that cron reports.
HTTP only; the writes are app/store/check_ins.py.

The pings take no API key: the token in the URL is the capability. It is random, kept only
as its SHA-256, shown when the check is created or its token rotated, and never read back.
A token that names no check is a 404 and counts as a failed authentication of the client's
address (too many: 429); each token may ping CRONHOOK_CHECK_PINGS_PER_MIN times a minute
(per API replica). GET works as POST does, for a plain `curl` or `wget`.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request, Response

from app.api.audit import Audited, set_audit_object
from app.api.deps import CallerDep, Conn, LabelFilter, QuotasDep, SettingsDep, TenantId, client_address, too_many
from app.api.errors import PROBLEM_JSON, Problem
from app.api.quotas import _PerMinute
from app.api.schemas.check_ins import (
    CheckCreate,
    CheckPingPublic,
    CheckPingUrl,
    CheckPublic,
    CheckUpdate,
    CheckWithPingUrl,
    PingAnswer,
)
from app.api.schemas.pages import Page, page_of
from app.domain.check_ins import (
    PING_BODY_CHARS,
    CheckStatus,
    PingKind,
    after_ping,
    changed_schedule,
    check_schedule,
    deadlines_after,
    kept_body,
    new_ping_token,
    ping_url,
    rescheduled,
)
from app.domain.completion import token_digest
from app.store import check_ins as store
from app.store.pagination import decode_int_cursor, decode_time_id_cursor, encode_cursor

router = APIRouter()
# Registered first: /v1/checks/ping/... is never read as /v1/checks/{check_id}/...
_pings = APIRouter(prefix="/v1/checks/ping", tags=["checks"])
_checks = APIRouter(prefix="/v1/checks", tags=["checks"], dependencies=[Audited])

NOT_FOUND = "check not found"

# Checks -------------------------------------------------------------------------------------


def _public(row: Any) -> CheckPublic:
    return CheckPublic.model_validate(dict(row))


@_checks.post("", status_code=201, operation_id="createCheck")
async def create_check(
    body: CheckCreate, caller: CallerDep, conn: Conn, settings: SettingsDep, request: Request
) -> CheckWithPingUrl:
    """A check, its clock running from now: it goes down unless pinged by its first due
    time plus its grace. The ping URL is shown this once."""
    schedule = check_schedule(body.every_s, body.cron, body.timezone, caller.now)
    deadlines = deadlines_after(schedule, body.grace_s, caller.now)
    token = new_ping_token()
    row = await store.check_create(
        conn,
        caller.tenant_id,
        {
            "name": body.name,
            "every_s": schedule.every_s,
            "cron": schedule.cron,
            "timezone": schedule.timezone,
            "grace_s": body.grace_s,
            "labels": body.labels or {},
            "token_hash": token_digest(token),
            "next_due_at": deadlines.next_due_at,
            "alert_at": deadlines.alert_at,
        },
    )
    set_audit_object(request, row["id"])
    return CheckWithPingUrl(**_public(row).model_dump(), ping_url=ping_url(settings.completion_base_url, token))


@_checks.get("", operation_id="listChecks")
async def list_checks(
    tenant_id: TenantId,
    conn: Conn,
    labels: LabelFilter = None,
    status: CheckStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: str | None = None,
) -> Page[CheckPublic]:
    """Newest first."""
    after = decode_time_id_cursor(cursor) if cursor else None
    rows = await store.check_list(conn, tenant_id, limit + 1, after, labels, status)
    return page_of(rows, limit, _public)


@_checks.get("/{check_id}", operation_id="getCheck")
async def get_check(check_id: uuid.UUID, tenant_id: TenantId, conn: Conn) -> CheckPublic:
    row = await store.check_get(conn, tenant_id, check_id)
    if row is None:
        raise Problem(404, NOT_FOUND, slug="not-found")
    return _public(row)


@_checks.patch("/{check_id}", operation_id="updateCheck")
async def update_check(check_id: uuid.UUID, body: CheckUpdate, caller: CallerDep, conn: Conn) -> CheckPublic:
    current = await store.check_get(conn, caller.tenant_id, check_id, lock=True)
    if current is None:
        raise Problem(404, NOT_FOUND, slug="not-found")
    changes: dict[str, Any] = {}
    if body.name is not None:
        changes["name"] = body.name
    if body.labels is not None:
        changes["labels"] = body.labels
    was = store.schedule_of(current)
    schedule = changed_schedule(was, body.every_s, body.cron, body.timezone, caller.now)
    grace_s = current["grace_s"] if body.grace_s is None else body.grace_s
    if schedule != was or grace_s != current["grace_s"]:
        deadlines = rescheduled(
            schedule,
            grace_s,
            status=CheckStatus(current["status"]),
            last_ping_at=current["last_ping_at"],
            last_started_at=current["last_started_at"],
            created_at=current["created_at"],
        )
        changes |= {
            "every_s": schedule.every_s,
            "cron": schedule.cron,
            "timezone": schedule.timezone,
            "grace_s": grace_s,
            "next_due_at": deadlines.next_due_at,
            "alert_at": deadlines.alert_at,
        }
    if not changes:
        return _public(current)
    row = await store.check_update(conn, caller.tenant_id, check_id, changes)
    assert row is not None  # locked above
    return _public(row)


@_checks.delete("/{check_id}", status_code=204, operation_id="deleteCheck")
async def delete_check(check_id: uuid.UUID, tenant_id: TenantId, conn: Conn) -> Response:
    if not await store.check_delete(conn, tenant_id, check_id):
        raise Problem(404, NOT_FOUND, slug="not-found")
    return Response(status_code=204)


@_checks.post("/{check_id}/rotate-token", operation_id="rotateCheckToken")
async def rotate_token(check_id: uuid.UUID, tenant_id: TenantId, conn: Conn, settings: SettingsDep) -> CheckPingUrl:
    """A new ping URL; the old one stops working at once (a 404, as any unknown token)."""
    token = new_ping_token()
    if not await store.check_set_token(conn, tenant_id, check_id, token_digest(token)):
        raise Problem(404, NOT_FOUND, slug="not-found")
    return CheckPingUrl(id=check_id, ping_url=ping_url(settings.completion_base_url, token))


@_checks.get("/{check_id}/pings", operation_id="listCheckPings")
async def list_pings(
    check_id: uuid.UUID,
    tenant_id: TenantId,
    conn: Conn,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: str | None = None,
) -> Page[CheckPingPublic]:
    """Newest first; the reaper keeps each check's newest CRONHOOK_CHECK_PINGS_KEPT."""
    if await store.check_get(conn, tenant_id, check_id) is None:
        raise Problem(404, NOT_FOUND, slug="not-found")
    before = decode_int_cursor(cursor) if cursor else None
    rows = await store.check_ping_list(conn, tenant_id, check_id, limit + 1, before)
    return page_of(rows, limit, CheckPingPublic.model_validate, lambda row: encode_cursor(row["id"]))


# Pings --------------------------------------------------------------------------------------

TokenPath = Annotated[str, Path(max_length=200, description="The token of the check's ping URL (its last segment)")]


def _allowance(request: Request, settings: SettingsDep) -> _PerMinute:
    """Pings each token may make a minute, kept per app (this API replica), as Quotas keeps
    the completion tokens' reports."""
    state = request.app.state
    allowance: _PerMinute | None = getattr(state, "check_ping_allowance", None)
    if allowance is None:
        allowance = state.check_ping_allowance = _PerMinute(float(settings.check_pings_per_min))
    return allowance


async def _admitted(request: Request, quotas: QuotasDep, settings: SettingsDep, token: TokenPath) -> str:
    """The token's SHA-256, once its address and the token may ping again."""
    if (wait_s := quotas.auth_wait(client_address(request.scope))) is not None:
        raise too_many("too many unknown ping tokens from this address", wait_s, "ping-throttled")
    digest = token_digest(token)
    if (wait_s := _allowance(request, settings).take_if_any(digest)) is not None:
        raise too_many("too many pings with this token", wait_s, "ping-throttled")
    return digest


Admitted = Annotated[str, Depends(_admitted)]

_PROBLEM = {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}}
_RETRY_AFTER = {"Retry-After": {"schema": {"type": "integer"}, "description": "Seconds"}}
# No API key, so the contract's rules (app/api/contract.py) would leave these out.
_PING_DOC: dict[int | str, dict[str, Any]] = {
    429: {
        "description": "Too many pings with this token, or unknown tokens from this address; see Retry-After",
        "content": _PROBLEM,
        "headers": _RETRY_AFTER,
    },
    503: {
        "description": "The database is unavailable; retry after Retry-After",
        "content": _PROBLEM,
        "headers": _RETRY_AFTER,
    },
}
_PING_BODY = {
    "requestBody": {
        "required": False,
        "description": f"Optional: anything (a script's output); its first {PING_BODY_CHARS} characters are kept",
        "content": {"text/plain": {"schema": {"type": "string"}}},
    }
}


async def _ping(request: Request, digest: str, kind: PingKind, conn: Conn, quotas: QuotasDep) -> PingAnswer:
    address = client_address(request.scope)
    check = await store.check_lock_by_token(conn, digest)
    if check is None:
        quotas.auth_failed(address)
        raise Problem(404, "unknown ping token", slug="not-found")
    outcome = after_ping(store.state_of(check), kind, check["db_now"])
    body = kept_body(await request.body())
    updated = await store.check_record_ping(conn, check, kind, outcome, body=body, remote_addr=address)
    return PingAnswer(status=updated["status"], next_due_at=updated["next_due_at"], alert_at=updated["alert_at"])


def _ping_route(kind: PingKind) -> Callable[..., Awaitable[PingAnswer]]:
    async def ping(request: Request, token: Admitted, conn: Conn, quotas: QuotasDep) -> PingAnswer:
        return await _ping(request, token, kind, conn, quotas)

    return ping


_PING_ROUTES = (
    (
        "",
        PingKind.SUCCESS,
        "pingCheck",
        "The checked job ran and succeeded: the check is up (check.up if it was down), next due one period on",
    ),
    (
        "/start",
        PingKind.START,
        "pingCheckStart",
        "The checked job started: it must end (a success or fail ping) within the check's grace_s. A down "
        "check stays down until its success ping",
    ),
    ("/fail", PingKind.FAIL, "pingCheckFail", "The checked job failed: the check is down (check.down if it was not)"),
)
for _suffix, _kind, _operation_id, _description in _PING_ROUTES:
    _pings.add_api_route(
        f"/{{token}}{_suffix}",
        _ping_route(_kind),
        methods=["POST"],
        operation_id=_operation_id,
        description=f"{_description}. No API key: the token is the capability. GET works too.",
        responses=_PING_DOC,
        openapi_extra=_PING_BODY,
    )
    # For `curl https://.../v1/checks/ping/<token>` and `wget -q -O- ...`: the same ping.
    _pings.add_api_route(f"/{{token}}{_suffix}", _ping_route(_kind), methods=["GET"], include_in_schema=False)

router.include_router(_pings)
router.include_router(_checks)
