"""Idempotency-Key on POST /v1/jobs and POST /v1/targets, on a real database."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from typing import Any

import httpx
import pytest
from sqlalchemy import FromClause, column, func, select, table, update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.app import create_app
from app.api.idempotency import request_hash
from app.api.schemas.jobs import JobCreate
from app.db.engine import create_engine
from app.settings import Settings
from app.store.idempotency import idempotency_key_claim, idempotency_key_purge_expired
from app.store.tables import idempotency_keys, jobs, targets
from app.store.tenants import api_key_authenticate
from tests.conftest import TEST_KEY_RING, make_target, new_tenant

URL = "http://127.0.0.1:9/hook"


async def count(engine: AsyncEngine, table_: FromClause) -> int:
    async with engine.connect() as conn:
        return int(await conn.scalar(select(func.count()).select_from(table_)) or 0)


async def key_rows(engine: AsyncEngine) -> list[dict[str, Any]]:
    async with engine.connect() as conn:
        return [dict(row) for row in (await conn.execute(select(idempotency_keys))).mappings()]


def keyed(auth: dict[str, str], key: str) -> dict[str, str]:
    return {**auth, "Idempotency-Key": key}


@pytest.fixture
async def target(client: httpx.AsyncClient, auth: dict[str, str]) -> dict[str, Any]:
    return await make_target(client, auth, URL)


def job_body(target: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"target_id": target["id"], "payload": {"order": 42}, "delay_s": 60, **fields}


async def test_a_retry_gets_the_original_response_and_creates_nothing(
    client: httpx.AsyncClient, auth: dict[str, str], target: dict[str, Any], engine: AsyncEngine
) -> None:
    first = await client.post("/v1/jobs", json=job_body(target), headers=keyed(auth, "order-42"))
    assert first.status_code == 201, first.text
    assert "idempotent-replayed" not in first.headers

    # Same body, other key order: the hash is of the validated body, not of the bytes.
    reordered = {"delay_s": 60, "payload": {"order": 42}, "target_id": target["id"]}
    replay = await client.post("/v1/jobs", json=reordered, headers=keyed(auth, "order-42"))
    assert replay.status_code == 201
    assert replay.headers["idempotent-replayed"] == "true"
    assert replay.json() == first.json()
    assert await count(engine, jobs) == 1
    assert await count(engine, idempotency_keys) == 1

    # The stored response is replayed as it was, even after the job has moved on.
    assert (await client.post(f"/v1/jobs/{first.json()['id']}/cancel", headers=auth)).status_code == 200
    later = await client.post("/v1/jobs", json=job_body(target), headers=keyed(auth, "order-42"))
    assert later.status_code == 201 and later.json() == first.json()
    assert await count(engine, jobs) == 1


async def test_the_same_key_with_another_body_is_refused_and_writes_nothing(
    client: httpx.AsyncClient, auth: dict[str, str], target: dict[str, Any], engine: AsyncEngine
) -> None:
    first = await client.post("/v1/jobs", json=job_body(target), headers=keyed(auth, "k1"))
    assert first.status_code == 201
    stored_before = await key_rows(engine)

    other = await client.post("/v1/jobs", json=job_body(target, payload={"order": 43}), headers=keyed(auth, "k1"))
    assert other.status_code == 422
    assert other.headers["content-type"] == "application/problem+json"
    problem = other.json()
    assert problem["type"] == "urn:cronhook:problem:idempotency-key-reused"
    assert [e["field"] for e in problem["errors"]] == ["Idempotency-Key"]
    assert await count(engine, jobs) == 1
    assert await key_rows(engine) == stored_before


async def test_another_key_or_no_key_creates_another_job(
    client: httpx.AsyncClient, auth: dict[str, str], target: dict[str, Any], engine: AsyncEngine
) -> None:
    a = await client.post("/v1/jobs", json=job_body(target), headers=keyed(auth, "a"))
    b = await client.post("/v1/jobs", json=job_body(target), headers=keyed(auth, "b" * 255))
    c = await client.post("/v1/jobs", json=job_body(target), headers=auth)
    assert [r.status_code for r in (a, b, c)] == [201, 201, 201]
    assert len({r.json()["id"] for r in (a, b, c)}) == 3
    assert "idempotent-replayed" not in b.headers
    assert await count(engine, jobs) == 3
    assert await count(engine, idempotency_keys) == 2  # no key, no row


async def test_keys_belong_to_one_tenant(
    client: httpx.AsyncClient, auth: dict[str, str], target: dict[str, Any], engine: AsyncEngine
) -> None:
    other = await new_tenant(engine)
    target_body = {"name": "hook", "url": URL}
    mine = await client.post("/v1/targets", json=target_body, headers=keyed(auth, "shared"))
    theirs = await client.post("/v1/targets", json=target_body, headers=keyed(other, "shared"))
    assert mine.status_code == theirs.status_code == 201
    assert "idempotent-replayed" not in theirs.headers
    assert mine.json()["id"] != theirs.json()["id"]

    # Their key "j" and mine are independent too, and their body may not name my target.
    their_target = theirs.json()
    my_job = await client.post("/v1/jobs", json=job_body(target), headers=keyed(auth, "j"))
    their_job = await client.post("/v1/jobs", json=job_body(their_target), headers=keyed(other, "j"))
    assert my_job.status_code == their_job.status_code == 201
    assert my_job.json()["id"] != their_job.json()["id"]
    assert (await client.get(f"/v1/jobs/{my_job.json()['id']}", headers=other)).status_code == 404
    assert await count(engine, jobs) == 2


async def test_a_target_replay_carries_the_current_secret_which_is_never_stored(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine
) -> None:
    body = {"name": "hook", "url": URL, "headers": {"Authorization": "Bearer s3cr3t-token"}}
    first = await client.post("/v1/targets", json=body, headers=keyed(auth, "t1"))
    assert first.status_code == 201
    secret = first.json()["secret"]

    replay = await client.post("/v1/targets", json=body, headers=keyed(auth, "t1"))
    assert replay.status_code == 201 and replay.headers["idempotent-replayed"] == "true"
    assert replay.json() == first.json()
    assert await count(engine, targets) == 1

    [row] = await key_rows(engine)
    assert row["status_code"] == 201
    assert "secret" not in row["response"]
    assert secret not in str(row) and "s3cr3t-token" not in str(row)

    # After a rotation the replay carries the secret that signs deliveries now.
    rotated = (await client.post(f"/v1/targets/{first.json()['id']}/rotate-secret", headers=auth)).json()["secret"]
    again = await client.post("/v1/targets", json=body, headers=keyed(auth, "t1"))
    assert again.json() == {**first.json(), "secret": rotated}


@pytest.mark.parametrize(
    "key",
    [
        b"",
        b"two words",
        b"x" * 256,
        "caf\u00e9".encode(),
        b"tab\there",
    ],
)
async def test_a_malformed_key_is_a_problem_naming_the_header(
    client: httpx.AsyncClient, auth: dict[str, str], target: dict[str, Any], engine: AsyncEngine, key: bytes
) -> None:
    # As bytes: httpx takes either str or bytes headers, not a mix.
    headers = {name.encode(): value.encode() for name, value in auth.items()} | {b"Idempotency-Key": key}
    response = await client.post("/v1/jobs", json=job_body(target), headers=headers)
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert "Idempotency-Key" in [e["field"] for e in response.json()["errors"]]
    assert await count(engine, jobs) == 0
    assert await count(engine, idempotency_keys) == 0


async def test_an_expired_key_can_be_used_again(
    client: httpx.AsyncClient, auth: dict[str, str], target: dict[str, Any], engine: AsyncEngine
) -> None:
    first = await client.post("/v1/jobs", json=job_body(target), headers=keyed(auth, "old"))
    assert first.status_code == 201
    async with engine.begin() as conn:
        await conn.execute(update(idempotency_keys).values(created_at=func.now() - dt.timedelta(hours=24, seconds=1)))

    # Another body is fine now: the old row counts as absent and is replaced.
    second = await client.post("/v1/jobs", json=job_body(target, payload={"order": 43}), headers=keyed(auth, "old"))
    assert second.status_code == 201, second.text
    assert "idempotent-replayed" not in second.headers
    assert second.json()["id"] != first.json()["id"]
    [row] = await key_rows(engine)
    assert row["response"]["id"] == second.json()["id"]

    # And the replacement is replayed like any other key.
    third = await client.post("/v1/jobs", json=job_body(target, payload={"order": 43}), headers=keyed(auth, "old"))
    assert third.headers["idempotent-replayed"] == "true" and third.json() == second.json()
    assert await count(engine, jobs) == 2


async def test_a_failed_request_leaves_its_key_unused(
    client: httpx.AsyncClient, auth: dict[str, str], target: dict[str, Any], engine: AsyncEngine
) -> None:
    unknown = job_body(target, target_id="00000000-0000-4000-8000-000000000000")
    failed = await client.post("/v1/jobs", json=unknown, headers=keyed(auth, "retry-me"))
    assert failed.status_code == 422 and failed.json()["errors"][0]["field"] == "target_id"
    assert await count(engine, idempotency_keys) == 0

    fixed = await client.post("/v1/jobs", json=job_body(target), headers=keyed(auth, "retry-me"))
    assert fixed.status_code == 201, fixed.text
    assert "idempotent-replayed" not in fixed.headers
    assert await count(engine, jobs) == 1


async def test_a_key_committed_without_a_response_is_a_conflict(
    client: httpx.AsyncClient, auth: dict[str, str], target: dict[str, Any], engine: AsyncEngine
) -> None:
    body = job_body(target)
    async with engine.begin() as conn:
        tenant_id = await api_key_authenticate(conn, auth["Authorization"].removeprefix("Bearer "))
        assert tenant_id is not None
        digest = request_hash(JobCreate.model_validate(body))
        assert await idempotency_key_claim(conn, tenant_id, "POST /v1/jobs", "stuck", digest)

    response = await client.post("/v1/jobs", json=body, headers=keyed(auth, "stuck"))
    assert response.status_code == 409
    assert response.json()["type"] == "urn:cronhook:problem:idempotency-key-in-use"
    assert await count(engine, jobs) == 0


async def test_purge_deletes_expired_keys_oldest_first_in_batches(
    client: httpx.AsyncClient, auth: dict[str, str], target: dict[str, Any], engine: AsyncEngine
) -> None:
    for key in ("a", "b", "c"):
        assert (await client.post("/v1/jobs", json=job_body(target), headers=keyed(auth, key))).status_code == 201
    async with engine.begin() as conn:
        for key, age_h in (("a", 30), ("b", 25)):
            await conn.execute(
                update(idempotency_keys)
                .where(idempotency_keys.c.key == key)
                .values(created_at=func.now() - dt.timedelta(hours=age_h))
            )

    purged = []
    for _ in range(3):
        async with engine.begin() as conn:
            purged.append(await idempotency_key_purge_expired(conn, limit=1))
    assert purged == [1, 1, 0]
    assert [row["key"] for row in await key_rows(engine)] == ["c"]


pg_stat_activity = table(
    "pg_stat_activity", column("datname"), column("wait_event_type"), column("query"), column("state")
)


async def lock_waiters(engine: AsyncEngine) -> list[str]:
    """The statements of this database's sessions that are waiting for a lock."""
    stmt = select(pg_stat_activity.c.query).where(
        pg_stat_activity.c.datname == func.current_database(), pg_stat_activity.c.wait_event_type == "Lock"
    )
    async with engine.connect() as conn:
        return list((await conn.execute(stmt)).scalars())


async def test_fifty_concurrent_duplicates_create_one_job(settings: Settings, db_url: str, engine: AsyncEngine) -> None:
    # A pool as large as the burst, so every request holds its own connection at once.
    burst = 50
    wide = create_engine(db_url, pool_size=burst)
    app = create_app(settings, engine=wide)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://cronhook.test") as http:
            auth = await new_tenant(engine)
            target = await make_target(http, auth, URL)
            async with engine.connect() as blocker:
                # While the target row is locked, the request that claimed the key waits at the
                # target (claim uncommitted), so every duplicate reaches the database and waits
                # on that claim: all fifty are in flight together.
                await blocker.execute(select(targets.c.id).where(targets.c.id == target["id"]).with_for_update())
                requests = [
                    asyncio.create_task(http.post("/v1/jobs", json=job_body(target), headers=keyed(auth, "burst")))
                    for _ in range(burst)
                ]
                deadline = time.monotonic() + 20
                while len(waiting := await lock_waiters(engine)) < burst and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                assert len(waiting) == burst, waiting
                assert sum("INSERT INTO idempotency_keys" in query for query in waiting) == burst - 1
                await blocker.rollback()
            responses = await asyncio.gather(*requests)
    finally:
        await wide.dispose()

    assert [r.status_code for r in responses] == [201] * burst
    assert len({r.json()["id"] for r in responses}) == 1
    assert sum(r.headers.get("idempotent-replayed") == "true" for r in responses) == burst - 1
    assert await count(engine, jobs) == 1


async def test_the_reaper_purges_keys_past_24_hours(
    client: httpx.AsyncClient, auth: dict[str, str], target: dict[str, Any], engine: AsyncEngine
) -> None:
    from app.services.reaper import Reaper, ReaperConfig

    for key in ("stale", "fresh"):
        assert (await client.post("/v1/jobs", json=job_body(target), headers=keyed(auth, key))).status_code == 201
    async with engine.begin() as conn:
        await conn.execute(
            update(idempotency_keys)
            .where(idempotency_keys.c.key == "stale")
            .values(created_at=func.now() - dt.timedelta(hours=25))
        )
    assert (await Reaper(engine, ReaperConfig(), TEST_KEY_RING).run_once()).idempotency_keys_purged == 1
    assert [row["key"] for row in await key_rows(engine)] == ["fresh"]
