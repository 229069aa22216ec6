"""Request ids and the audit record of every mutation.

The request id (`X-Request-Id`, set and echoed by app/api/observability.py) is stored with
the audit row. A mutating route's router carries the `Audited`
dependency: when the handler returns without error, one audit row is written in the
request's own transaction, so the log holds exactly the mutations that committed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import Depends, Request

from app.api.deps import Conn, TenantId
from app.logs import REQUEST_ID
from app.store.audit import audit_append
from app.store.tenants import Caller

MUTATING_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def request_id_of(request: Request) -> str | None:
    """The request's id, as app/api/observability.py set it (and echoes it)."""
    return REQUEST_ID.get()


def set_audit_object(request: Request, object_id: object) -> None:
    """Names the object a create made (other routes name it in their path)."""
    request.state.audit_object_id = str(object_id)


async def _audited(request: Request, tenant_id: TenantId, conn: Conn) -> AsyncIterator[None]:
    # TenantId first: router dependencies are solved before the route's own, and the
    # request must be admitted (app/api/quotas.py) before it takes a connection.
    yield
    # A handler that wrote its own audit row (with the statement that made the change) says so.
    if request.method not in MUTATING_METHODS or getattr(request.state, "audited", False):
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
