"""Delivery end to end: jobs created through the API, delivered by the scheduler over real
HTTP to a receiver on 127.0.0.1, outcomes read back through the API."""

from __future__ import annotations

import asyncio
import datetime as dt
import inspect
import itertools
import socket
from collections.abc import Callable
from typing import Any

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine
from standardwebhooks.webhooks import Webhook

from app.services.reaper import Reaper, ReaperConfig
from app.services.scheduler import Scheduler
from app.services.scheduler_config import SchedulerConfig
from app.settings import Settings
from app.store.jobs import db_now
from tests.conftest import TEST_KEY_RING, make_job, make_target
from tests.receiver import Receiver, Reply, wait_for


async def drive(scheduler: Scheduler, until: Callable[[], object], timeout: float = 60.0, message: str = "") -> None:
    """Runs scheduler passes (as run_forever would) until `until()` holds (it may be async)."""

    async def step() -> bool:
        await scheduler.run_once()
        result = until()
        if inspect.isawaitable(result):
            result = await result
        return bool(result)

    await wait_for(step, timeout=timeout, interval=0.05, message=message)


async def get_job(client: httpx.AsyncClient, auth: dict[str, str], job_id: str) -> dict[str, Any]:
    response = await client.get(f"/v1/jobs/{job_id}", headers=auth)
    body: dict[str, Any] = response.json()
    return body


async def job_state(client: httpx.AsyncClient, auth: dict[str, str], job_id: str) -> str:
    state: str = (await get_job(client, auth, job_id))["state"]
    return state


async def get_runs(client: httpx.AsyncClient, auth: dict[str, str], job_id: str) -> list[dict[str, Any]]:
    """Oldest first, in the order they happened (the API lists newest first by default)."""
    response = await client.get(f"/v1/jobs/{job_id}/runs", headers=auth, params={"order": "asc"})
    items: list[dict[str, Any]] = response.json()["items"]
    return items


async def test_delayed_job_is_delivered_once_signed_and_succeeds(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler, engine: AsyncEngine
) -> None:
    target = await make_target(client, auth, receiver.url(), headers={"X-Team": "blue"})
    payload = {"order": 17, "items": ["a", "b"], "note": "héllo"}
    job = await make_job(client, auth, target["id"], delay_s=2, payload=payload)
    due = dt.datetime.fromisoformat(job["next_run_at"])

    # Not delivered before it is due (checked only if this pass ended before the due time on
    # the database's clock: busy cores may make the pass itself take that long).
    await scheduler.run_once()
    async with engine.connect() as conn:
        if await db_now(conn) < due:
            assert receiver.requests == []

    await drive(scheduler, lambda: len(receiver.requests) >= 1, message="delivery")
    # A few more passes must not deliver it again.
    for _ in range(5):
        await scheduler.run_once()
    assert len(receiver.requests) == 1
    request = receiver.requests[0]
    assert request.at >= due.timestamp() - 0.05  # never early (allowing clock granularity)

    # The reference library verifies the signature with the target's secret.
    assert Webhook(target["secret"]).verify(request.body, request.headers) == payload
    assert request.headers["x-team"] == "blue"
    assert request.headers["cronhook-job-id"] == job["id"]
    assert request.headers["cronhook-attempt"] == "1"
    assert dt.datetime.fromisoformat(request.headers["cronhook-scheduled-for"]) == due
    assert request.headers["content-type"] == "application/json"

    final = await get_job(client, auth, job["id"])
    assert final["state"] == "succeeded" and final["finished_at"] and final["next_run_at"] is None
    (run,) = await get_runs(client, auth, job["id"])
    assert run["outcome"] == "success" and run["status_code"] == 200 and run["attempt"] == 1
    assert run["duration_ms"] is not None and run["started_at"] <= run["finished_at"]


async def test_failing_twice_then_ok_gives_three_runs_and_success(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler
) -> None:
    receiver.script = [Reply(status=500, body=b"boom"), Reply(status=503)]
    target = await make_target(client, auth, receiver.url())
    job = await make_job(client, auth, target["id"], max_attempts=5, backoff_base_s=0.05, backoff_max_s=0.2)

    async def done() -> bool:
        return await job_state(client, auth, job["id"]) == "succeeded"

    await drive(scheduler, done, message="success after retries")
    runs = await get_runs(client, auth, job["id"])
    assert [(r["attempt"], r["outcome"], r["status_code"]) for r in runs] == [
        (1, "http_error", 500),
        (2, "http_error", 503),
        (3, "success", 200),
    ]
    assert runs[0]["error"].startswith("HTTP 500: boom")
    # The same occurrence keeps its webhook-id across retries.
    assert len(set(receiver.webhook_ids())) == 1 and len(receiver.requests) == 3
    assert [r.headers["cronhook-attempt"] for r in receiver.requests] == ["1", "2", "3"]


async def test_always_failing_ends_dead_with_one_dead_letter(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler
) -> None:
    receiver.default = Reply(status=500, body=b"down for maintenance")
    target = await make_target(client, auth, receiver.url())
    job = await make_job(client, auth, target["id"], max_attempts=3, backoff_base_s=0.05, backoff_max_s=0.1)

    async def dead() -> bool:
        return await job_state(client, auth, job["id"]) == "dead"

    await drive(scheduler, dead, message="dead")
    for _ in range(5):
        await scheduler.run_once()
    assert len(receiver.requests) == 3
    assert [r["attempt"] for r in await get_runs(client, auth, job["id"])] == [1, 2, 3]
    letters = (await client.get("/v1/dead-letters", params={"include": "payload"}, headers=auth)).json()["items"]
    assert len(letters) == 1
    letter = letters[0]
    assert letter["job_id"] == job["id"] and letter["attempts"] == 3
    assert letter["last_status_code"] == 500 and "down for maintenance" in letter["last_error"]
    assert letter["payload"] == {"hello": "world"}


async def test_recurring_job_fires_with_distinct_ids_until_cancelled(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler, engine: AsyncEngine
) -> None:
    target = await make_target(client, auth, receiver.url())
    job = await make_job(client, auth, target["id"], every_s=1)
    await drive(scheduler, lambda: len(receiver.requests) >= 3, timeout=60, message="three occurrences")
    ids = receiver.webhook_ids()
    assert len(ids) == len(set(ids)) >= 3
    fired_for = [dt.datetime.fromisoformat(r.headers["cronhook-scheduled-for"]) for r in receiver.requests]
    # Fixed rate: occurrences sit on the one-second grid from the first fire time.
    assert all((b - a) % dt.timedelta(seconds=1) == dt.timedelta(0) for a, b in itertools.pairwise(fired_for))
    assert (await get_job(client, auth, job["id"]))["state"] == "scheduled"

    upcoming = dt.datetime.fromisoformat((await get_job(client, auth, job["id"]))["next_run_at"])
    cancelled = await client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth)
    assert cancelled.json()["state"] == "cancelled"
    seen = len(receiver.requests)

    async def two_fire_times_passed() -> bool:
        # Scheduler passes until the database's clock is past two more fire times.
        await scheduler.run_once()
        async with engine.connect() as conn:
            now = await db_now(conn)
        return now > upcoming + dt.timedelta(seconds=1)

    await wait_for(two_fire_times_passed, timeout=30, message="two fire times passed")
    assert len(receiver.requests) == seen


async def test_timeouts_redirects_and_refused_connections_are_failed_attempts(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler
) -> None:
    receiver.script = [Reply(status=302, headers={"Location": receiver.url("/elsewhere")})]
    redirect_target = await make_target(client, auth, receiver.url("/redirect"))
    slow_target = await make_target(client, auth, receiver.url("/slow"), timeout_s=0.5)
    closed_target = await make_target(client, auth, "http://127.0.0.1:9/closed")
    policy = {"max_attempts": 1}
    redirected = await make_job(client, auth, redirect_target["id"], **policy)
    await drive(scheduler, lambda: len(receiver.requests) >= 1, message="redirect attempt")
    receiver.default = Reply(delay_s=3)
    slow = await make_job(client, auth, slow_target["id"], **policy)
    refused = await make_job(client, auth, closed_target["id"], **policy)

    async def all_dead() -> bool:
        jobs = [await get_job(client, auth, j["id"]) for j in (redirected, slow, refused)]
        return all(j["state"] == "dead" for j in jobs)

    await drive(scheduler, all_dead, message="all dead")
    assert [r.path for r in receiver.requests].count("/elsewhere") == 0  # never followed
    (redirect_run,) = await get_runs(client, auth, redirected["id"])
    assert (redirect_run["outcome"], redirect_run["status_code"]) == ("http_error", 302)
    (slow_run,) = await get_runs(client, auth, slow["id"])
    # Cut at the target's 0.5 s deadline, not waiting for the 3 s answer (a success then).
    assert slow_run["outcome"] == "timeout" and slow_run["duration_ms"] >= 500
    (refused_run,) = await get_runs(client, auth, refused["id"])
    assert refused_run["outcome"] == "connection_error" and refused_run["error"]


async def test_a_huge_response_is_read_only_up_to_64_kb(
    client: httpx.AsyncClient, auth: dict[str, str], scheduler: Scheduler
) -> None:
    # A receiver that streams an endless body and counts what the client took off the socket:
    # its send buffer and ours are pinned small, so bytes sent ~ bytes the delivery read.
    sent = 0
    answered = asyncio.Event()

    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal sent
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        writer.transport.set_write_buffer_limits(high=0)
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 1073741824\r\n\r\n")
        answered.set()
        chunk = b"z" * 1024
        try:
            for _ in range(1024 * 1024):
                writer.write(chunk)
                await asyncio.wait_for(writer.drain(), timeout=15)  # the reader stopped reading
                sent += len(chunk)
        except (ConnectionError, TimeoutError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(endless, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        target = await make_target(client, auth, f"http://127.0.0.1:{port}/hook", timeout_s=3)
        job = await make_job(client, auth, target["id"], max_attempts=1)

        async def dead() -> bool:
            return await job_state(client, auth, job["id"]) == "dead"

        await drive(scheduler, dead, message="dead")
    finally:
        server.close()
        await server.wait_closed()
    (run,) = await get_runs(client, auth, job["id"])
    # Answered, not timed out: the delivery stopped reading and dropped the connection.
    assert answered.is_set() and run["outcome"] == "http_error" and run["status_code"] == 500
    # 64 KB read, plus what the client's kernel buffered (its receive window) before the
    # close; a client reading the whole body would have taken the full gigabyte.
    assert 64 * 1024 <= sent < 1024 * 1024, sent


async def test_the_reaper_retries_a_delivery_whose_lease_expired(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, engine: AsyncEngine, settings: Settings
) -> None:
    target = await make_target(client, auth, receiver.url())
    job = await make_job(client, auth, target["id"], backoff_base_s=0.05, backoff_max_s=0.1)
    # Claim with a lease the process then "loses" (nothing delivers it).
    from app.store.claims import job_claim_due

    async with engine.begin() as conn:
        (claimed,) = await job_claim_due(conn, TEST_KEY_RING, "crashed-replica", 1, 0.5)
    reaper = Reaper(engine, ReaperConfig(interval_s=0.1), TEST_KEY_RING)

    async def rescued() -> bool:
        await reaper.run_once()
        return await job_state(client, auth, job["id"]) == "retrying"

    await wait_for(rescued, timeout=30, message="reaped")
    sched = Scheduler(engine, SchedulerConfig.from_settings(settings), TEST_KEY_RING)
    try:
        await drive(sched, lambda: len(receiver.requests) == 1, message="redelivered")
    finally:
        await sched.close(grace_s=5)
    assert receiver.requests[0].headers["cronhook-attempt"] == "2"
    assert receiver.requests[0].headers["webhook-id"] == f"msg_{claimed.occurrence_id.hex}"
    runs = await get_runs(client, auth, job["id"])
    assert [r["outcome"] for r in runs] == ["lease_expired", "success"]


async def test_a_receiver_body_postgres_cannot_store_is_recorded_cleanly(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler
) -> None:
    receiver.script = [Reply(status=500, body=b"bad\x00byte \xff\xfe")]
    target = await make_target(client, auth, receiver.url())
    jobs = [await make_job(client, auth, target["id"], backoff_base_s=0.05, backoff_max_s=0.1) for _ in range(5)]

    async def all_succeeded() -> bool:
        states = [(await get_job(client, auth, j["id"]))["state"] for j in jobs]
        return states == ["succeeded"] * len(jobs)

    await drive(scheduler, all_succeeded, message="all succeeded")
    # One failed attempt (the odd body) and five successes; nobody was delivered twice.
    assert len(receiver.requests) == 6
    errors = [r["error"] for j in jobs for r in await get_runs(client, auth, j["id"]) if r["error"]]
    assert len(errors) == 1 and errors[0].startswith("HTTP 500: bad") and "\x00" not in errors[0]


async def test_a_non_retryable_answer_dead_letters_at_once_and_retry_after_is_honoured(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler
) -> None:
    gone_target = await make_target(client, auth, receiver.url("/gone"))
    receiver.script = [Reply(status=404, body=b"no such hook")]
    gone = await make_job(client, auth, gone_target["id"], max_attempts=5, backoff_base_s=0.05)

    async def dead() -> bool:
        return await job_state(client, auth, gone["id"]) == "dead"

    await drive(scheduler, dead, message="404 dead-lettered")
    (run,) = await get_runs(client, auth, gone["id"])
    assert run["status_code"] == 404 and "not retryable" in run["error"]
    assert len((await client.get("/v1/dead-letters", headers=auth)).json()["items"]) == 1

    busy_target = await make_target(client, auth, receiver.url("/busy"))
    receiver.script = [Reply(status=429, headers={"Retry-After": "1"})]
    busy = await make_job(client, auth, busy_target["id"], max_attempts=3, backoff_base_s=0.01, backoff_max_s=0.02)

    async def succeeded() -> bool:
        return await job_state(client, auth, busy["id"]) == "succeeded"

    await drive(scheduler, succeeded, message="429 then success")
    first, second = [r for r in receiver.requests if r.path == "/busy"]
    # The backoff alone would be at most 20 ms; the receiver asked for a second.
    assert second.at - first.at >= 0.95


async def test_a_claim_too_old_to_trust_is_released_without_a_post(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, engine: AsyncEngine, scheduler: Scheduler
) -> None:
    import time as time_module

    from app.store.claims import job_claim_due

    target = await make_target(client, auth, receiver.url())
    job = await make_job(client, auth, target["id"], max_attempts=1)
    await scheduler.ownership.run_once()
    held = scheduler.ownership.held()
    async with engine.begin() as conn:
        (claimed,) = await job_claim_due(
            conn, TEST_KEY_RING, scheduler.config.replica_id, 1, scheduler.config.lease_s, held
        )
    # As if the process had stalled since the claim for longer than the lease can cover.
    stalled_since = time_module.monotonic() - scheduler.config.lease_s
    await scheduler._deliver(claimed, held[claimed.partition], stalled_since)
    assert receiver.requests == []
    released = await get_job(client, auth, job["id"])
    assert released["state"] == "scheduled" and released["attempt"] == 0
    # Its single attempt is still there: the next pass delivers it.
    await drive(scheduler, lambda: len(receiver.requests) == 1, message="delivered after release")
