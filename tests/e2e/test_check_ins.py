"""Inbound check-ins end to end (app/domain/check_ins.py): checks made through the API, pinged
without an API key, moved down by the reaper's check watch when overdue, and their
check.down / check.up events delivered by a real scheduler to a real receiver on 127.0.0.1
(events on /events), signed, once each, with a stable webhook-id. Also /start and /fail,
throttling, tenant isolation, refused input naming the field, and the token kept as a hash."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import uuid
from typing import Any
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo

import httpx
from sqlalchemy import func, select, text, update
from sqlalchemy.ext.asyncio import AsyncEngine
from standardwebhooks.webhooks import Webhook

from app.api.app import create_app
from app.services.check_watch import check_watch_once
from app.services.scheduler import Scheduler
from app.settings import Settings
from app.store.tables import jobs
from app.store.tables_watch import checks
from tests.conftest import make_target, new_tenant
from tests.e2e.test_delivery import drive
from tests.problems import assert_problem, row_counts
from tests.receiver import Received, Receiver, Reply, wait_for


def at(receiver: Receiver, path: str) -> list[Received]:
    return [r for r in receiver.requests if r.path == path]


async def make_check(client: httpx.AsyncClient, auth: dict[str, str], **fields: Any) -> dict[str, Any]:
    schedule = {} if "cron" in fields else {"every_s": 3600}
    body = {"name": "nightly backup", **schedule, "grace_s": 300, **fields}
    answer = await client.post("/v1/checks", headers=auth, json=body)
    assert answer.status_code == 201, answer.text
    check: dict[str, Any] = answer.json()
    return check


def ping_path(check: dict[str, Any], suffix: str = "") -> str:
    return str(urlsplit(check["ping_url"]).path) + suffix


async def ping(client: httpx.AsyncClient, check: dict[str, Any], suffix: str = "", **kwargs: Any) -> dict[str, Any]:
    """A ping as a cron's script sends it: no API key."""
    answer = await client.post(ping_path(check, suffix), **kwargs)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


async def subscribe(client: httpx.AsyncClient, auth: dict[str, str], target_id: str, *types: str) -> None:
    answer = await client.post("/v1/event-subscriptions", headers=auth, json={"target_id": target_id, "types": types})
    assert answer.status_code == 201, answer.text


async def get_check(client: httpx.AsyncClient, auth: dict[str, str], check_id: str) -> dict[str, Any]:
    answer = await client.get(f"/v1/checks/{check_id}", headers=auth)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


async def event_jobs(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int(await conn.scalar(select(func.count()).where(jobs.c.event_type.is_not(None))) or 0)


def opened(request: Received, secret: str) -> dict[str, Any]:
    """The event's body, its signature checked with the subscribed target's secret."""
    body: dict[str, Any] = Webhook(secret).verify(request.body, request.headers)
    assert request.headers["webhook-id"] == f"msg_{uuid.UUID(body['id']).hex}"
    return body


async def test_an_overdue_check_goes_down_and_its_next_ping_brings_it_up_each_reported_once(
    client: httpx.AsyncClient,
    auth: dict[str, str],
    receiver: Receiver,
    scheduler: Scheduler,
    engine: AsyncEngine,
    settings: Settings,
) -> None:
    events = await make_target(client, auth, receiver.url("/events"))
    await subscribe(client, auth, events["id"], "check.down", "check.up")
    # Another tenant listening for the same types hears nothing of this tenant's checks.
    stranger = await new_tenant(engine)
    await subscribe(client, stranger, (await make_target(client, stranger, receiver.url("/other")))["id"], "check.down")
    # Its first delivery fails: the retry carries the same webhook-id.
    receiver.script = [Reply(status=503)]

    check = await make_check(client, auth, every_s=1, grace_s=0, labels={"team": "ops"})
    assert check["status"] == "new" and check["ping_url"].startswith(f"{settings.completion_base_url}/v1/checks/ping/")
    assert check["alert_at"] == check["next_due_at"]

    async def down() -> bool:
        return await check_watch_once(engine, 100, 100) == 1

    # Never pinged: its clock ran from its creation.
    await wait_for(down, timeout=30, interval=0.1, message="the never-pinged check goes down")
    assert (await get_check(client, auth, check["id"]))["status"] == "down"
    for _ in range(3):
        assert await check_watch_once(engine, 100, 100) == 0
    assert await event_jobs(engine) == 1
    await drive(scheduler, lambda: len(at(receiver, "/events")) == 2, timeout=60, message="check.down, retried")

    answer = await ping(client, check, content="backup ok")
    assert answer["status"] == "up"
    await drive(scheduler, lambda: len(at(receiver, "/events")) == 3, timeout=60, message="check.up")
    for _ in range(3):
        await scheduler.run_once()

    delivered = at(receiver, "/events")
    assert len(delivered) == 3 and at(receiver, "/other") == []
    failed, retried, came_up = (opened(r, events["secret"]) for r in delivered)
    assert failed == retried and delivered[0].headers["webhook-id"] == delivered[1].headers["webhook-id"]
    assert delivered[1].headers["webhook-id"] != delivered[2].headers["webhook-id"]
    assert (retried["type"], came_up["type"]) == ("check.down", "check.up")
    down_data = retried["data"]
    assert down_data["check_id"] == check["id"] and down_data["name"] == "nightly backup"
    assert down_data["status"] == "down" and down_data["labels"] == {"team": "ops"} and down_data["grace_s"] == 0
    assert down_data["last_ping_at"] is None and down_data["last_ping_kind"] is None
    assert down_data["next_due_at"] is not None
    up_data = came_up["data"]
    assert up_data["status"] == "up" and up_data["last_ping_kind"] == "success" and up_data["last_ping_at"]
    assert came_up["tenant_id"] == retried["tenant_id"]
    # The events are jobs of their own, on the event target, settled.
    async with engine.connect() as conn:
        rows = (await conn.execute(select(jobs.c.event_type, jobs.c.state, jobs.c.target_id))).all()
    assert sorted((row.event_type, row.state, str(row.target_id)) for row in rows) == [
        ("check.down", "succeeded", events["id"]),
        ("check.up", "succeeded", events["id"]),
    ]


async def test_fail_and_start_pings_and_the_pings_kept(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler, engine: AsyncEngine
) -> None:
    events = await make_target(client, auth, receiver.url("/events"))
    await subscribe(client, auth, events["id"], "check.down", "check.up")
    check = await make_check(client, auth, cron="0 3 * * *", timezone="Europe/Paris", grace_s=600)

    started = await ping(client, check, "/start")
    assert started["status"] == "started"
    failed = await ping(client, check, "/fail", content=b"tar: disk full\n")
    assert failed["status"] == "down"
    assert (await ping(client, check, "/fail"))["status"] == "down"  # no second check.down
    assert (await ping(client, check, "/start"))["status"] == "down"  # a start does not bring it up
    # GET works as POST does (curl, wget); the run that started ends well: up again.
    answer = await client.get(ping_path(check))
    assert answer.status_code == 200 and answer.json()["status"] == "up", answer.text
    read = await get_check(client, auth, check["id"])
    assert read["status"] == "up" and read["last_ping_kind"] == "success"
    # Due at the next 03:00 in Paris after the ping, down 10 minutes later.
    due = dt.datetime.fromisoformat(read["next_due_at"])
    pinged = dt.datetime.fromisoformat(read["last_ping_at"])
    assert due.astimezone(ZoneInfo("Europe/Paris")).time() == dt.time(3, 0)
    assert pinged < due <= pinged + dt.timedelta(days=1)
    assert dt.datetime.fromisoformat(read["alert_at"]) == due + dt.timedelta(minutes=10)

    pings = (await client.get(f"/v1/checks/{check['id']}/pings", headers=auth)).json()["items"]
    assert [p["kind"] for p in pings] == ["success", "start", "fail", "fail", "start"]
    assert pings[2]["body"] is None and pings[3]["body"] == "tar: disk full\n"
    assert pings[3]["duration_ms"] is not None and pings[0]["duration_ms"] is not None
    assert pings[4]["duration_ms"] is None and all(p["remote_addr"] for p in pings)
    page = (await client.get(f"/v1/checks/{check['id']}/pings", headers=auth, params={"limit": 3})).json()
    rest = await client.get(
        f"/v1/checks/{check['id']}/pings", headers=auth, params={"limit": 3, "cursor": page["next_cursor"]}
    )
    assert [p["id"] for p in page["items"] + rest.json()["items"]] == [p["id"] for p in pings]

    await drive(scheduler, lambda: len(at(receiver, "/events")) == 2, timeout=60, message="check.down, check.up")
    for _ in range(3):
        await scheduler.run_once()
    assert [json.loads(r.body)["type"] for r in at(receiver, "/events")] == ["check.down", "check.up"]

    # The check watch keeps each check's newest pings only.
    await check_watch_once(engine, 100, pings_kept=2)
    kept = (await client.get(f"/v1/checks/{check['id']}/pings", headers=auth)).json()["items"]
    assert [p["id"] for p in kept] == [p["id"] for p in pings[:2]]


async def test_a_ping_needs_no_api_key_but_its_token_which_is_kept_only_as_a_hash(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine
) -> None:
    check = await make_check(client, auth)
    token = check["ping_url"].rsplit("/", 1)[1]
    assert (await ping(client, check))["status"] == "up"
    for wrong in (token[:-2] + "xx", "ckp_" + "A" * 32, "nonsense"):
        assert_problem(await client.post(f"/v1/checks/ping/{wrong}"), 404)
        assert_problem(await client.post(f"/v1/checks/ping/{wrong}/fail"), 404)
    assert_problem(await client.post(f"/v1/checks/ping/{'x' * 201}"), 422, "token")

    # Never read back: not in reads, lists, nor stored but as its SHA-256.
    reads = [
        (await client.get(f"/v1/checks/{check['id']}", headers=auth)).text,
        (await client.get("/v1/checks", headers=auth)).text,
        (await client.get("/v1/audit", headers=auth)).text,
    ]
    assert all(token not in read and "ping_url" not in read for read in reads)
    async with engine.connect() as conn:
        stored = (await conn.execute(select(checks.c.token_hash).where(checks.c.id == check["id"]))).scalar_one()
        dump = "\n".join((await conn.execute(text("SELECT c::text FROM checks c"))).scalars())
    assert stored == hashlib.sha256(token.encode()).hexdigest() and token not in dump

    # A new token: the old one stops working at once.
    rotated = await client.post(f"/v1/checks/{check['id']}/rotate-token", headers=auth)
    assert rotated.status_code == 200, rotated.text
    assert rotated.json()["id"] == check["id"] and rotated.json()["ping_url"] != check["ping_url"]
    assert_problem(await client.post(ping_path(check)), 404)
    assert (await ping(client, rotated.json()))["status"] == "up"


async def test_pings_are_throttled_per_token_and_bad_tokens_per_address(
    settings: Settings, engine: AsyncEngine, auth: dict[str, str]
) -> None:
    strict = settings.model_copy(update={"check_pings_per_min": 3, "failed_auth_per_min": 5})
    app = create_app(strict, engine=engine)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://cronhook.test") as client:
        busy = await make_check(client, auth)
        quiet = await make_check(client, auth)
        for _ in range(3):
            await ping(client, busy)
        refused = assert_problem(await client.post(ping_path(busy, "/start")), 429)
        assert refused["type"] == "urn:cronhook:problem:ping-throttled"
        assert int((await client.post(ping_path(busy))).headers["retry-after"]) >= 1
        # Another token has its own allowance; the refused pings were not recorded.
        await ping(client, quiet)
        pings = (await client.get(f"/v1/checks/{busy['id']}/pings", headers=auth)).json()["items"]
        assert len(pings) == 3

        # Guessing tokens: each a failed authentication of the address, then 429 for all of its pings.
        for index in range(5):
            assert_problem(await client.post(f"/v1/checks/ping/ckp_guess{index}"), 404)
        assert_problem(await client.post("/v1/checks/ping/ckp_guess9"), 429)
        assert_problem(await client.post(ping_path(quiet)), 429)


async def test_another_tenants_check_is_not_found(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine
) -> None:
    check = await make_check(client, auth)
    other = await new_tenant(engine)
    for method, path, body in [
        ("GET", f"/v1/checks/{check['id']}", None),
        ("PATCH", f"/v1/checks/{check['id']}", {"name": "mine now"}),
        ("DELETE", f"/v1/checks/{check['id']}", None),
        ("POST", f"/v1/checks/{check['id']}/rotate-token", None),
        ("GET", f"/v1/checks/{check['id']}/pings", None),
    ]:
        assert_problem(await client.request(method, path, headers=other, json=body), 404)
    assert (await client.get("/v1/checks", headers=other)).json()["items"] == []
    assert (await get_check(client, auth, check["id"]))["name"] == "nightly backup"
    assert (await ping(client, check))["status"] == "up"


async def test_a_check_is_listed_changed_and_deleted(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine
) -> None:
    first = await make_check(client, auth, name="db dump", labels={"team": "data"})
    second = await make_check(client, auth, name="cert renewal", cron="0 4 * * 1")
    await ping(client, first, "/fail")
    listed = (await client.get("/v1/checks", headers=auth)).json()["items"]
    assert [c["id"] for c in listed] == [second["id"], first["id"]] and "ping_url" not in listed[0]
    by_label = (await client.get("/v1/checks", headers=auth, params={"label": "team=data"})).json()["items"]
    by_status = (await client.get("/v1/checks", headers=auth, params={"status": "down"})).json()["items"]
    assert [c["id"] for c in by_label] == [c["id"] for c in by_status] == [first["id"]]

    changed = await client.patch(
        f"/v1/checks/{second['id']}", headers=auth, json={"every_s": 600, "grace_s": 60, "labels": {"tier": "1"}}
    )
    assert changed.status_code == 200, changed.text
    body = changed.json()
    assert (body["every_s"], body["cron"], body["grace_s"], body["labels"]) == (600, None, 60, {"tier": "1"})
    # Never pinged: due 600 s after its creation now, down 60 s after that.
    created = dt.datetime.fromisoformat(second["created_at"])
    assert dt.datetime.fromisoformat(body["next_due_at"]) == created + dt.timedelta(seconds=600)
    assert dt.datetime.fromisoformat(body["alert_at"]) == created + dt.timedelta(seconds=660)
    renamed = await client.patch(f"/v1/checks/{second['id']}", headers=auth, json={"name": "certs"})
    assert renamed.json()["name"] == "certs" and renamed.json()["alert_at"] == body["alert_at"]

    assert (await client.delete(f"/v1/checks/{first['id']}", headers=auth)).status_code == 204
    assert_problem(await client.get(f"/v1/checks/{first['id']}", headers=auth), 404)
    assert_problem(await client.post(ping_path(first)), 404)
    assert [c["id"] for c in (await client.get("/v1/checks", headers=auth)).json()["items"]] == [second["id"]]


async def test_bad_input_is_refused_naming_the_field_and_writes_nothing(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine
) -> None:
    check = await make_check(client, auth)
    before = await row_counts(engine)
    base = {"name": "n", "every_s": 60, "grace_s": 0}
    creates: list[tuple[dict[str, Any], str]] = [
        ({"every_s": 60, "grace_s": 0}, "name"),
        ({"name": "n", "every_s": 60}, "grace_s"),
        ({"name": "n", "grace_s": 0}, "every_s"),
        ({**base, "cron": "* * * * *"}, "cron"),
        ({**base, "timezone": "Europe/Paris"}, "timezone"),
        ({"name": "n", "cron": "not cron", "grace_s": 0}, "cron"),
        ({"name": "n", "cron": "0 2 * * *", "timezone": "Mars/Base", "grace_s": 0}, "timezone"),
        ({**base, "every_s": 0}, "every_s"),
        ({**base, "every_s": "60"}, "every_s"),
        ({**base, "every_s": True}, "every_s"),
        ({**base, "grace_s": -1}, "grace_s"),
        ({**base, "name": ""}, "name"),
        ({**base, "labels": {"Bad Key": "x"}}, "labels"),
        ({**base, "ping_url": "http://x"}, "ping_url"),
    ]
    for body, field in creates:
        assert_problem(await client.post("/v1/checks", headers=auth, json=body), 422, field)
    patches: list[tuple[dict[str, Any], str]] = [
        ({"every_s": 60, "cron": "* * * * *"}, "cron"),
        ({"timezone": "Europe/Paris"}, "timezone"),
        ({"grace_s": 1.5}, "grace_s"),
        ({"status": "up"}, "status"),
    ]
    for body, field in patches:
        assert_problem(await client.patch(f"/v1/checks/{check['id']}", headers=auth, json=body), 422, field)
    assert_problem(await client.get("/v1/checks/not-an-id", headers=auth), 422, "check_id")
    assert_problem(await client.get("/v1/checks", headers=auth, params={"status": "sideways"}), 422, "status")
    assert_problem(
        await client.get(f"/v1/checks/{check['id']}/pings", headers=auth, params={"cursor": "x"}), 400, "cursor"
    )
    assert (await client.post("/v1/checks", json=base)).status_code == 401
    assert await row_counts(engine) == before


async def test_a_check_another_watch_holds_is_skipped_and_goes_down_once(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine
) -> None:
    check = await make_check(client, auth)
    overdue = await make_check(client, auth)
    async with engine.begin() as conn:
        await conn.execute(
            update(checks)
            .where(checks.c.id.in_([uuid.UUID(check["id"]), uuid.UUID(overdue["id"])]))
            .values(alert_at=func.now() - text("interval '1 minute'"))
        )
    # A ping holds the first check's row while the watch runs: it is skipped, not waited for.
    async with engine.connect() as holder:
        await holder.execute(select(checks.c.id).where(checks.c.id == uuid.UUID(check["id"])).with_for_update())
        assert await check_watch_once(engine, 1, 100) == 1
        await holder.rollback()
    assert await check_watch_once(engine, 1, 100) == 1
    assert await check_watch_once(engine, 1, 100) == 0
    statuses = {(await get_check(client, auth, c["id"]))["status"] for c in (check, overdue)}
    assert statuses == {"down"}
