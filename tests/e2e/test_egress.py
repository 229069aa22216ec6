"""The egress policy at delivery: a sentinel listener on 127.0.0.1 must receive nothing from
targets that reach it by any spelling, unless CRONHOOK_EGRESS_ALLOW covers it.

Targets are written through the store, not the API: they stand for rows accepted before the
policy existed, or names whose DNS changed after the create-time check.
"""

from __future__ import annotations

import json
import signal
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.egress import parse_egress_allow
from app.services.scheduler import Scheduler
from app.services.scheduler_config import SchedulerConfig
from app.store.runs import run_list_for_job
from app.store.tables import jobs
from tests.conftest import TEST_KEY_RING
from tests.e2e.test_delivery import drive
from tests.e2e.test_processes import Processes, base_env, free_port, wait_until_ready
from tests.factories import make_jobs, make_tenant_and_target
from tests.receiver import Receiver, Reply, wait_for

# Every way the sentinel at 127.0.0.1:{port} can be named in a URL.
SNEAKY_URLS = [
    "http://127.0.0.1:{port}/literal",
    "http://localhost:{port}/dns-name",
    "http://LocalHost:{port}/dns-name-upper",
    "http://[::ffff:127.0.0.1]:{port}/ipv4-mapped",
    "http://[::127.0.0.1]:{port}/ipv4-compatible",
    "http://[64:ff9b::7f00:1]:{port}/nat64",
    "http://2130706433:{port}/decimal",
    "http://0x7f000001:{port}/hex",
    "http://0177.0.0.1:{port}/octal",
    "http://127.1:{port}/short",
    "http://0.0.0.0:{port}/unspecified",
]


@pytest.fixture
async def sentinel() -> AsyncIterator[Receiver]:
    recv = Receiver()
    await recv.start()
    try:
        yield recv
    finally:
        await recv.stop()


def scheduler_with(engine: AsyncEngine, allow: str) -> Scheduler:
    config = SchedulerConfig(
        replica_id=f"egress-{uuid.uuid4().hex[:6]}",
        lease_s=10,
        max_target_timeout_s=3,
        lease_margin_s=1,
        egress=parse_egress_allow(allow),
    )
    return Scheduler(engine, config, TEST_KEY_RING)


async def job_to(engine: AsyncEngine, url: str) -> tuple[uuid.UUID, uuid.UUID]:
    tenant_id, target_id = await make_tenant_and_target(engine, url)
    (job_id,) = await make_jobs(engine, tenant_id, target_id, max_attempts=3)
    return tenant_id, job_id


async def state_of(engine: AsyncEngine, job_id: uuid.UUID) -> str:
    async with engine.connect() as conn:
        state: str | None = await conn.scalar(select(jobs.c.state).where(jobs.c.id == job_id))
    assert state is not None
    return state


async def runs_of(engine: AsyncEngine, tenant_id: uuid.UUID, job_id: uuid.UUID) -> list[dict[str, Any]]:
    async with engine.connect() as conn:
        rows = await run_list_for_job(conn, tenant_id, job_id, 100, None)
    assert rows is not None
    return [dict(row) for row in rows]


async def deliver_all(scheduler: Scheduler, engine: AsyncEngine, job_ids: list[uuid.UUID], final: str) -> None:
    async def settled() -> bool:
        return all([await state_of(engine, j) == final for j in job_ids])

    try:
        await drive(scheduler, settled, message=f"all {final}")
    finally:
        await scheduler.close(grace_s=5)


async def test_the_default_policy_delivers_nothing_to_loopback_by_any_spelling_and_does_not_retry(
    engine: AsyncEngine, sentinel: Receiver
) -> None:
    created = [await job_to(engine, url.format(port=sentinel.port)) for url in SNEAKY_URLS]
    await deliver_all(scheduler_with(engine, ""), engine, [job for _, job in created], "dead")
    assert sentinel.requests == []
    for (tenant_id, job_id), url in zip(created, SNEAKY_URLS, strict=True):
        runs = await runs_of(engine, tenant_id, job_id)
        # One attempt of three: a refusal is final. The error names no address or port.
        assert [(r["outcome"], r["error"]) for r in runs] == [("connection_error", "egress_denied")], url


async def test_an_allowed_receiver_redirecting_to_a_denied_address_reaches_nothing_there(
    engine: AsyncEngine, sentinel: Receiver, receiver: Receiver
) -> None:
    # Only the name `localhost` is allowed: the sentinel's address stays refused when spelled
    # out, although `localhost` resolves to it.
    receiver.default = Reply(status=302, headers={"Location": f"http://127.0.0.1:{sentinel.port}/redirected"})
    tenant_id, redirected = await job_to(engine, f"http://localhost:{receiver.port}/hook")
    literal_tenant, literal = await job_to(engine, f"http://127.0.0.1:{sentinel.port}/literal")
    _, hex_literal = await job_to(engine, f"http://0x7f000001:{sentinel.port}/hex")
    scheduler = scheduler_with(engine, "localhost")

    async def settled() -> bool:
        return await state_of(engine, literal) == "dead" and await state_of(engine, hex_literal) == "dead"

    try:
        await drive(scheduler, lambda: len(receiver.requests) >= 1 and settled(), message="attempts")
    finally:
        await scheduler.close(grace_s=5)
    assert sentinel.requests == []
    assert receiver.requests[0].path == "/hook"
    first_redirect = (await runs_of(engine, tenant_id, redirected))[0]
    assert (first_redirect["outcome"], first_redirect["status_code"]) == ("http_error", 302)
    (literal_run,) = await runs_of(engine, literal_tenant, literal)
    assert literal_run["error"] == "egress_denied"


async def test_deliveries_go_through_when_the_allow_list_covers_the_address(
    engine: AsyncEngine, sentinel: Receiver
) -> None:
    urls = [
        f"http://127.0.0.1:{sentinel.port}/literal",
        f"http://localhost:{sentinel.port}/dns-name",
        f"http://[::ffff:127.0.0.1]:{sentinel.port}/ipv4-mapped",
    ]
    created = [await job_to(engine, url) for url in urls]
    closed_tenant, closed = await job_to(engine, "http://127.0.0.1:9/closed")
    await deliver_all(scheduler_with(engine, "127.0.0.0/8"), engine, [job for _, job in created], "succeeded")
    assert sorted(r.path for r in sentinel.requests) == ["/dns-name", "/ipv4-mapped", "/literal"]

    # A refused connection to an allowed address says so, and nothing about address or port.
    scheduler = scheduler_with(engine, "127.0.0.0/8")

    async def attempted() -> bool:
        return bool(await runs_of(engine, closed_tenant, closed))

    try:
        await drive(scheduler, attempted, message="closed port attempted")
    finally:
        await scheduler.close(grace_s=5)
    (closed_run, *_) = await runs_of(engine, closed_tenant, closed)
    assert closed_run["outcome"] == "connection_error"
    assert closed_run["error"] == "connection failed: refused"


@pytest.mark.e2e
async def test_cronhook_up_refuses_internal_targets_by_default_and_warns_when_allowed(
    engine: AsyncEngine, db_url: str, procs: Processes, sentinel: Receiver
) -> None:
    port = free_port()
    key = "chk_e2e_egress_key_for_tests"
    # CRONHOOK_EGRESS_ALLOW unset: the default every deployment gets.
    env = {k: v for k, v in base_env(CRONHOOK_DATABASE_URL=db_url).items() if k != "CRONHOOK_EGRESS_ALLOW"}
    env.update(CRONHOOK_BOOTSTRAP_API_KEY=key, CRONHOOK_POLL_INTERVAL_S="0.1", CRONHOOK_LOG_LEVEL="INFO")
    service = procs.start("up", ["up", "--port", str(port)], env)
    tenant_id, job_id = await job_to(engine, f"http://localhost:{sentinel.port}/rebound")
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
        await wait_until_ready(http, timeout=30)
        auth = {"Authorization": f"Bearer {key}"}
        # cronhook's own API, with another tenant's key: the attack the policy exists for.
        own_api = {"name": "x", "url": f"http://127.0.0.1:{port}/v1/targets", "headers": {"Authorization": "Bearer k"}}
        for body in (own_api, {"name": "x", "url": f"http://localhost:{sentinel.port}/"}):
            refused = await http.post("/v1/targets", json=body, headers=auth)
            assert refused.status_code == 422, refused.text
            assert [e["field"] for e in refused.json()["errors"]] == ["url"]

        async def dead() -> bool:
            return await state_of(engine, job_id) == "dead"

        await wait_for(dead, timeout=20, message="refused delivery dead-lettered")
    service.send_signal(signal.SIGTERM)
    service.wait(timeout=15)
    assert sentinel.requests == []
    assert [r["error"] for r in await runs_of(engine, tenant_id, job_id)] == ["egress_denied"]
    assert "egress_internal_allowed" not in procs.log("up")

    scheduler = procs.start("scheduler", ["scheduler"], base_env(CRONHOOK_DATABASE_URL=db_url))
    await wait_for(lambda: "egress_internal_allowed" in procs.log("scheduler"), timeout=20, message="warning")
    scheduler.send_signal(signal.SIGTERM)
    scheduler.wait(timeout=15)
    (warning,) = [
        e for e in map(json.loads, procs.log("scheduler").splitlines()) if e["event"] == "egress_internal_allowed"
    ]
    assert (warning["level"], warning["allowed"]) == ("warning", "127.0.0.0/8")


async def test_proxy_settings_in_the_environment_are_ignored(
    engine: AsyncEngine, sentinel: Receiver, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A proxy would make the checked connection the proxy's, and let it reach anything.
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, f"http://127.0.0.1:{sentinel.port}")
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    _, job_id = await job_to(engine, f"http://localhost:{receiver.port}/direct")
    await deliver_all(scheduler_with(engine, "localhost"), engine, [job_id], "succeeded")
    assert [r.path for r in receiver.requests] == ["/direct"]
    assert sentinel.requests == []
