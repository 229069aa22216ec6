"""Event subscriptions (/v1/event-subscriptions, app/api/routes/event_subscriptions.py) on a
real PostgreSQL: created, read, listed newest first by target and deleted, audited; bad
input refused naming the field and writing nothing; another tenant's subscription is a 404;
and the events written (app/store/events.py) follow the subscriptions as they are now."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.events import EventType
from app.store.events import event_emit
from app.store.tables import audit_log, jobs
from app.store.tables_watch import event_subscriptions
from tests.conftest import make_target, new_tenant
from tests.problems import assert_problem, row_counts

URL = "http://127.0.0.1:9/events"


async def subscribe(client: httpx.AsyncClient, auth: dict[str, str], **body: Any) -> httpx.Response:
    return await client.post("/v1/event-subscriptions", headers=auth, json=body)


async def created(client: httpx.AsyncClient, auth: dict[str, str], **body: Any) -> dict[str, Any]:
    answer = await subscribe(client, auth, **body)
    assert answer.status_code == 201, answer.text
    subscription: dict[str, Any] = answer.json()
    return subscription


async def tenant_of(engine: AsyncEngine, subscription_id: str) -> uuid.UUID:
    async with engine.connect() as conn:
        tenant_id = await conn.scalar(
            select(event_subscriptions.c.tenant_id).where(event_subscriptions.c.id == uuid.UUID(subscription_id))
        )
    assert isinstance(tenant_id, uuid.UUID)
    return tenant_id


async def event_targets(engine: AsyncEngine) -> list[str]:
    """The targets of the event deliveries written so far, by type."""
    async with engine.connect() as conn:
        rows = await conn.execute(select(jobs.c.target_id, jobs.c.event_type).where(jobs.c.event_type.is_not(None)))
    return sorted(f"{row.event_type}->{row.target_id}" for row in rows)


async def test_a_subscription_is_created_read_listed_and_deleted_and_each_change_audited(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine
) -> None:
    target = await make_target(client, auth, URL)
    other = await make_target(client, auth, URL)
    first = await created(client, auth, target_id=target["id"], types=["check.down", "check.up"], description="pager")
    assert first["target_id"] == target["id"] and first["types"] == ["check.down", "check.up"]
    assert first["description"] == "pager" and first["created_at"]
    second = await created(client, auth, target_id=other["id"], types=["job.health.failing"])
    third = await created(client, auth, target_id=target["id"], types=["occurrence.dead_lettered"])
    assert second["description"] is None

    read = await client.get(f"/v1/event-subscriptions/{first['id']}", headers=auth)
    assert read.status_code == 200 and read.json() == first

    # Newest first, in pages, and by target.
    page = (await client.get("/v1/event-subscriptions", headers=auth, params={"limit": 2})).json()
    assert [item["id"] for item in page["items"]] == [third["id"], second["id"]] and page["next_cursor"]
    rest = await client.get("/v1/event-subscriptions", headers=auth, params={"limit": 2, "cursor": page["next_cursor"]})
    assert [item["id"] for item in rest.json()["items"]] == [first["id"]] and rest.json()["next_cursor"] is None
    by_target = await client.get("/v1/event-subscriptions", headers=auth, params={"target_id": target["id"]})
    assert [item["id"] for item in by_target.json()["items"]] == [third["id"], first["id"]]

    deleted = await client.delete(f"/v1/event-subscriptions/{first['id']}", headers=auth)
    assert deleted.status_code == 204
    assert_problem(await client.get(f"/v1/event-subscriptions/{first['id']}", headers=auth), 404)
    assert_problem(await client.delete(f"/v1/event-subscriptions/{first['id']}", headers=auth), 404)

    async with engine.connect() as conn:
        audited = (
            await conn.execute(
                select(audit_log.c.action, audit_log.c.object_id)
                .where(audit_log.c.action.like("%EventSubscription"))
                .order_by(audit_log.c.id)
            )
        ).all()
    assert [tuple(row) for row in audited] == [
        ("createEventSubscription", first["id"]),
        ("createEventSubscription", second["id"]),
        ("createEventSubscription", third["id"]),
        ("deleteEventSubscription", first["id"]),
    ]


async def test_bad_input_is_refused_naming_the_field_and_writes_nothing(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine
) -> None:
    target = await make_target(client, auth, URL)
    gone = await make_target(client, auth, URL)
    assert (await client.delete(f"/v1/targets/{gone['id']}", headers=auth)).status_code == 204
    foreign = await make_target(client, await new_tenant(engine), URL)
    before = await row_counts(engine)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"target_id": target["id"]}, "types"),
        ({"target_id": target["id"], "types": []}, "types"),
        ({"target_id": target["id"], "types": ["check.down", "check.sideways"]}, "types[1]"),
        ({"target_id": target["id"], "types": ["check.down", "check.up", "check.down"]}, "types[2]"),
        ({"target_id": target["id"], "types": "check.down"}, "types"),
        ({"types": ["check.down"]}, "target_id"),
        ({"target_id": "not-a-uuid", "types": ["check.down"]}, "target_id"),
        ({"target_id": str(uuid.uuid4()), "types": ["check.down"]}, "target_id"),
        ({"target_id": gone["id"], "types": ["check.down"]}, "target_id"),
        ({"target_id": foreign["id"], "types": ["check.down"]}, "target_id"),
        ({"target_id": target["id"], "types": ["check.down"], "description": "a\x07b"}, "description"),
        ({"target_id": target["id"], "types": ["check.down"], "url": URL}, "url"),
    ]
    for body, field in cases:
        assert_problem(await subscribe(client, auth, **body), 422, field)
    assert await row_counts(engine) == before
    assert_problem(await client.get("/v1/event-subscriptions/nope", headers=auth), 422, "subscription_id")
    assert_problem(await client.get("/v1/event-subscriptions", headers=auth, params={"cursor": "x"}), 400, "cursor")
    assert_problem(await client.get("/v1/event-subscriptions", headers=auth, params={"limit": 0}), 422, "limit")
    assert (await client.post("/v1/event-subscriptions", json={})).status_code == 401


async def test_another_tenants_subscription_is_not_found(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine
) -> None:
    target = await make_target(client, auth, URL)
    mine = await created(client, auth, target_id=target["id"], types=["check.down"])
    other = await new_tenant(engine)
    assert_problem(await client.get(f"/v1/event-subscriptions/{mine['id']}", headers=other), 404)
    assert_problem(await client.delete(f"/v1/event-subscriptions/{mine['id']}", headers=other), 404)
    listed = await client.get("/v1/event-subscriptions", headers=other, params={"target_id": target["id"]})
    assert listed.status_code == 200 and listed.json()["items"] == []
    assert (await client.get(f"/v1/event-subscriptions/{mine['id']}", headers=auth)).status_code == 200


async def test_events_go_to_the_subscriptions_of_their_type_and_tenant_as_they_are_now(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine
) -> None:
    pager = await make_target(client, auth, URL)
    chat = await make_target(client, auth, URL)
    downs = await created(client, auth, target_id=pager["id"], types=["check.down"])
    both = await created(client, auth, target_id=chat["id"], types=["check.down", "check.up"])
    tenant_id = await tenant_of(engine, downs["id"])
    # Another tenant's subscription to the same type hears nothing of this tenant's events.
    stranger = await new_tenant(engine)
    elsewhere = await make_target(client, stranger, URL)
    await created(client, stranger, target_id=elsewhere["id"], types=["check.down"])

    async with engine.begin() as conn:
        assert await event_emit(conn, tenant_id, EventType.CHECK_DOWN, {"check_id": "c1"}) == 2
        assert await event_emit(conn, tenant_id, EventType.CHECK_UP, {"check_id": "c1"}) == 1
        assert await event_emit(conn, tenant_id, EventType.TARGET_PAUSED, {"target_id": "t"}) == 0
    assert await event_targets(engine) == sorted(
        [f"check.down->{pager['id']}", f"check.down->{chat['id']}", f"check.up->{chat['id']}"]
    )

    # Deleted: no more events through it; those written stay.
    assert (await client.delete(f"/v1/event-subscriptions/{both['id']}", headers=auth)).status_code == 204
    async with engine.begin() as conn:
        assert await event_emit(conn, tenant_id, EventType.CHECK_UP, {"check_id": "c1"}) == 0
        assert await event_emit(conn, tenant_id, EventType.CHECK_DOWN, {"check_id": "c1"}) == 1
    async with engine.connect() as conn:
        written = await conn.scalar(select(func.count()).where(jobs.c.event_type.is_not(None)))
    assert written == 4
