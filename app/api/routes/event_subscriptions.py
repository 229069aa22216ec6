"""/v1/event-subscriptions: which of the tenant's targets receive which events (app/domain/
events.py). Each event is delivered to a subscribed target as a signed one-off job, retried,
visible in runs and replayable from the dead-letter queue. HTTP only; the rows are
app/store/event_subscriptions.py."""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response

from app.api.audit import Audited, set_audit_object
from app.api.checks import require_live_target
from app.api.deps import Conn, TenantId
from app.api.errors import Problem
from app.api.schemas.events import EventSubscriptionCreate, EventSubscriptionPublic
from app.api.schemas.pages import Page, page_of
from app.store import event_subscriptions as store
from app.store.pagination import decode_time_id_cursor

router = APIRouter(prefix="/v1/event-subscriptions", tags=["events"], dependencies=[Audited])

NOT_FOUND = "event subscription not found"


def _public(row: Any) -> EventSubscriptionPublic:
    return EventSubscriptionPublic.model_validate(dict(row))


@router.post("", status_code=201, operation_id="createEventSubscription")
async def create_event_subscription(
    body: EventSubscriptionCreate, tenant_id: TenantId, conn: Conn, request: Request
) -> EventSubscriptionPublic:
    """Events of `types` are delivered to the target from now on, each as its own signed
    one-off job (its webhook-id the event's id). An event is never about another event's
    delivery."""
    for index, event_type in enumerate(body.types):
        if event_type in body.types[:index]:
            raise Problem(422, f"{event_type.value} is listed twice", slug="validation", field=f"types[{index}]")
    # Share-locked, so the target cannot be deleted before the subscription commits.
    await require_live_target(conn, tenant_id, body.target_id)
    row = await store.event_subscription_create(conn, tenant_id, body.target_id, body.types, body.description)
    set_audit_object(request, row["id"])
    return _public(row)


@router.get("", operation_id="listEventSubscriptions")
async def list_event_subscriptions(
    tenant_id: TenantId,
    conn: Conn,
    target_id: Annotated[uuid.UUID | None, Query(description="Only the subscriptions of this target")] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: str | None = None,
) -> Page[EventSubscriptionPublic]:
    """Newest first."""
    after = decode_time_id_cursor(cursor) if cursor else None
    rows = await store.event_subscription_list(conn, tenant_id, limit + 1, after, target_id)
    return page_of(rows, limit, _public)


@router.get("/{subscription_id}", operation_id="getEventSubscription")
async def get_event_subscription(
    subscription_id: uuid.UUID, tenant_id: TenantId, conn: Conn
) -> EventSubscriptionPublic:
    row = await store.event_subscription_get(conn, tenant_id, subscription_id)
    if row is None:
        raise Problem(404, NOT_FOUND, slug="not-found")
    return _public(row)


@router.delete("/{subscription_id}", status_code=204, operation_id="deleteEventSubscription")
async def delete_event_subscription(subscription_id: uuid.UUID, tenant_id: TenantId, conn: Conn) -> Response:
    """No more events to the target from this subscription; those already written are
    delivered as usual (or can be cancelled as any job)."""
    if not await store.event_subscription_delete(conn, tenant_id, subscription_id):
        raise Problem(404, NOT_FOUND, slug="not-found")
    return Response(status_code=204)
