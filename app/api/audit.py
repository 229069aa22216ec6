"""Request ids and the audit record of every mutation.

`X-Request-Id` (the caller's, if it is a sane token, else a new one) is echoed on every
response and stored with the audit row. A mutating route's router carries the `Audited`
dependency: when the handler returns without error, one audit row is written in the
request's own transaction, so the log holds exactly the mutations that committed.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator

from fastapi import Depends, Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.deps import Conn, TenantId
from app.store.audit import audit_append
from app.store.tenants import Caller

REQUEST_ID_HEADER = "x-request-id"
_SANE_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
MUTATING_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class RequestId:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers", [])).get(REQUEST_ID_HEADER.encode(), b"").decode("latin-1")
        request_id = given if _SANE_REQUEST_ID.match(given) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", []).append((REQUEST_ID_HEADER.encode(), request_id.encode()))
            await send(message)

        await self.app(scope, receive, send_with_id)


def request_id_of(request: Request) -> str | None:
    return getattr(request.state, "request_id", None)


def set_audit_object(request: Request, object_id: object) -> None:
    """Names the object a create made (other routes name it in their path)."""
    request.state.audit_object_id = str(object_id)


async def _audited(request: Request, tenant_id: TenantId, conn: Conn) -> AsyncIterator[None]:
    # TenantId first: router dependencies are solved before the route's own, and the
    # request must be admitted (app/api/quotas.py) before it takes a connection.
    yield
    if request.method not in MUTATING_METHODS:
        return
    caller: Caller | None = getattr(request.state, "caller", None)
    if caller is None:
        return
    route = request.scope.get("route")
    object_id = getattr(request.state, "audit_object_id", None)
    if object_id is None and request.path_params:
        object_id = str(next(iter(request.path_params.values())))
    await audit_append(
        conn,
        tenant_id=caller.tenant_id,
        api_key_id=caller.api_key_id,
        actor="api_key",
        action=getattr(route, "operation_id", None) or f"{request.method} {request.url.path}",
        object_id=object_id,
        request_id=request_id_of(request),
    )


# scope="function": the row is written before the transaction commits (and the response).
Audited = Depends(_audited, scope="function")
