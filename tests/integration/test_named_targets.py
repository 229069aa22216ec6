"""Named targets (PUT/GET /v1/targets/by-name/{name}, app/api/target_upserts.py) on a real
PostgreSQL: created once with its secret, a PUT that changes nothing writes nothing, a change
applies as a PATCH would and keeps the secret, conditional requests, concurrent PUTs of one
name, an ambiguous name, a deleted target's name put again, bad names."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import httpx
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.keyring import SIGNING_SECRET
from app.store.tables import audit_log, targets
from tests.conftest import TEST_KEY_RING, make_target
from tests.problems import assert_problem, row_counts
from tests.receiver import Receiver


async def put(
    client: httpx.AsyncClient, auth: dict[str, str], name: str, body: dict[str, Any], **headers: str
) -> httpx.Response:
    return await client.put(f"/v1/targets/by-name/{name}", headers={**auth, **headers}, json=body)


async def count_targets(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int(await conn.scalar(select(func.count()).select_from(targets)) or 0)


async def sealed_secret(engine: AsyncEngine, target_id: str) -> str:
    async with engine.connect() as conn:
        sealed: str = (
            await conn.execute(select(targets.c.signing_secret).where(targets.c.id == target_id))
        ).scalar_one()
    return sealed


async def test_a_put_creates_once_with_the_secret_then_changes_nothing_when_nothing_differs(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, engine: AsyncEngine
) -> None:
    body = {"url": receiver.url(), "headers": {"Authorization": "Bearer t0ken-value"}, "timeout_s": 2}
    created = await put(client, auth, "billing", body)
    assert created.status_code == 201, created.text
    target = created.json()
    assert target["name"] == "billing" and target["secret"].startswith("whsec_")
    assert target["headers"] == {"Authorization": "<redacted>"}
    assert target["changed"] == ["async_counts_in_flight", "completion", "headers", "timeout_s", "url"]
    tag = created.headers["etag"]

    again = await put(client, auth, "billing", body)
    assert again.status_code == 200, again.text
    same = again.json()
    assert same["changed"] == [] and again.headers["etag"] == tag and "secret" not in same
    assert (same["id"], same["updated_at"]) == (target["id"], target["updated_at"])
    assert await count_targets(engine) == 1
    # One audit row per PUT, naming the target.
    async with engine.connect() as conn:
        audited = (
            await conn.execute(select(audit_log.c.object_id).where(audit_log.c.action == "putTargetByName"))
        ).all()
    assert [row.object_id for row in audited] == [target["id"]] * 2

    read = await client.get("/v1/targets/by-name/billing", headers=auth)
    assert read.status_code == 200 and read.headers["etag"] == tag and read.json()["id"] == target["id"]
    for text in (again.text, read.text, tag):
        assert target["secret"] not in text and "t0ken-value" not in text and "secret" not in text


async def test_a_change_applies_as_a_patch_keeping_the_secret_and_a_left_out_field_returns_to_its_default(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, engine: AsyncEngine
) -> None:
    body: dict[str, Any] = {"url": receiver.url("/a"), "headers": {"X-Team": "blue"}, "max_in_flight": 4}
    first = (await put(client, auth, "orders", body)).json()
    sealed = await sealed_secret(engine, first["id"])

    body.update(url=receiver.url("/b"), timeout_s=1.5)
    moved = await put(client, auth, "orders", body)
    assert moved.status_code == 200, moved.text
    changed = moved.json()
    assert changed["changed"] == ["timeout_s", "url"] and "secret" not in changed
    assert (changed["id"], changed["url"], changed["timeout_s"]) == (first["id"], receiver.url("/b"), 1.5)
    assert dt.datetime.fromisoformat(changed["updated_at"]) > dt.datetime.fromisoformat(first["updated_at"])
    # The secret is neither rotated nor answered: the one the create answered still signs.
    assert await sealed_secret(engine, first["id"]) == sealed
    assert TEST_KEY_RING.open(sealed, SIGNING_SECRET) == first["secret"]

    # A header's value is part of the definition (compared opened, never shown).
    body["headers"] = {"X-Team": "green"}
    recoloured = await put(client, auth, "orders", body)
    assert recoloured.json()["changed"] == ["headers"] and recoloured.headers["etag"] != moved.headers["etag"]
    assert "green" not in recoloured.text

    del body["max_in_flight"], body["timeout_s"]
    reset = (await put(client, auth, "orders", body)).json()
    assert reset["changed"] == ["max_in_flight", "timeout_s"]
    assert (reset["max_in_flight"], reset["timeout_s"]) == (None, 3)
    assert await count_targets(engine) == 1
    assert (await client.get(f"/v1/targets/{first['id']}", headers=auth)).json() == {
        k: v for k, v in reset.items() if k != "changed"
    }


async def test_conditional_puts_answer_412_and_write_nothing(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, engine: AsyncEngine
) -> None:
    body = {"url": receiver.url()}
    before = await row_counts(engine)
    assert_problem(await put(client, auth, "alerts", body, **{"If-Match": '"abc"'}), 412)
    assert await row_counts(engine) == before
    created = await put(client, auth, "alerts", body, **{"If-None-Match": "*"})
    assert created.status_code == 201, created.text
    tag = created.headers["etag"]

    before = await row_counts(engine)
    assert_problem(await put(client, auth, "alerts", body, **{"If-None-Match": "*"}), 412)
    stale = await put(client, auth, "alerts", {"url": receiver.url("/new")}, **{"If-Match": '"0123"'})
    assert_problem(stale, 412)
    assert await row_counts(engine) == before
    assert (await client.get("/v1/targets/by-name/alerts", headers=auth)).json()["url"] == receiver.url()

    fresh = await put(client, auth, "alerts", {"url": receiver.url("/new")}, **{"If-Match": tag})
    assert fresh.status_code == 200 and fresh.json()["changed"] == ["url"] and fresh.headers["etag"] != tag


async def test_twenty_concurrent_puts_of_one_name_leave_one_target(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, engine: AsyncEngine
) -> None:
    body = {"url": receiver.url(), "rate_per_s": 5.0}
    answers = await asyncio.gather(*(put(client, auth, "fan-in", body) for _ in range(20)))
    assert sorted(a.status_code for a in answers) == [200] * 19 + [201], [a.text for a in answers if a.is_error]
    assert len({a.json()["id"] for a in answers}) == 1
    assert [a.json()["changed"] for a in answers if a.status_code == 200] == [[]] * 19
    assert await count_targets(engine) == 1


async def test_an_ambiguous_name_is_a_409_naming_it(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, engine: AsyncEngine
) -> None:
    for _ in range(2):
        await make_target(client, auth, receiver.url(), name="twin")
    before = await row_counts(engine)
    refused = assert_problem(await put(client, auth, "twin", {"url": receiver.url("/x")}), 409, "name")
    assert refused["detail"] == "several targets are named 'twin': rename or delete all but one"
    assert_problem(await client.get("/v1/targets/by-name/twin", headers=auth), 409, "name")
    assert await row_counts(engine) == before


async def test_a_deleted_targets_name_can_be_put_again_and_reads_find_only_live_targets(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver
) -> None:
    assert_problem(await client.get("/v1/targets/by-name/x", headers=auth), 404)
    first = (await put(client, auth, "x", {"url": receiver.url()})).json()
    assert (await client.get("/v1/targets/by-name/x", headers=auth)).json()["id"] == first["id"]
    assert (await client.delete(f"/v1/targets/{first['id']}", headers=auth)).status_code == 204
    assert_problem(await client.get("/v1/targets/by-name/x", headers=auth), 404)
    second = await put(client, auth, "x", {"url": receiver.url()})
    assert second.status_code == 201 and second.json()["id"] != first["id"]
    assert second.json()["secret"] != first["secret"]


async def test_any_name_a_create_takes_is_reachable_and_bad_ones_are_refused_naming_the_field(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, engine: AsyncEngine
) -> None:
    for name, path in (("team/billing", "team/billing"), ("Billing (prod)", "Billing%20%28prod%29")):
        created = await client.put(f"/v1/targets/by-name/{path}", headers=auth, json={"url": receiver.url()})
        assert created.status_code == 201 and created.json()["name"] == name, created.text
        assert (await client.get(f"/v1/targets/by-name/{path}", headers=auth)).json()["name"] == name
    before = await row_counts(engine)
    for path in ("a%01b", "a%00b", "a" * 201):
        assert_problem(await put(client, auth, path, {"url": receiver.url()}), 422, "name")
        assert_problem(await client.get(f"/v1/targets/by-name/{path}", headers=auth), 422, "name")
    assert_problem(await put(client, auth, "named", {"name": "named", "url": receiver.url()}), 422, "name")
    assert_problem(await put(client, auth, "slow", {"url": receiver.url(), "timeout_s": 99}), 422, "timeout_s")
    assert_problem(await put(client, auth, "local", {"url": "http://10.0.0.1/"}), 422, "url")
    assert_problem(await put(client, auth, "no-url", {}), 422, "url")
    assert await row_counts(engine) == before
