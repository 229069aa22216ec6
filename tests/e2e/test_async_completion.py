"""Asynchronous completion end to end (app/domain/completion.py): a real receiver on
127.0.0.1 answers 202, then reports heartbeats and the outcome on the completion URL the
delivery carried, through the API.

Two kinds of receiver:
- the shared `receiver` (tests/receiver.py) answers 202 and the test reports on the URL's
  path through the in-process API client (the URL's host is not dialled);
- WorkerReceiver answers 202 and hands each delivery to a worker thread of its own, which
  reports over real HTTP on the completion URL itself: the API under test then listens on a
  real port (uvicorn on 127.0.0.1, `api_url`), and the scheduler mints URLs that name it.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import datetime as dt
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import uvicorn
from aiohttp import web
from sqlalchemy.ext.asyncio import AsyncEngine
from standardwebhooks.webhooks import Webhook

from app.api.app import create_app
from app.domain.completion import MAX_RESULT_BYTES, TOKEN_PREFIX, mint_token
from app.services.reaper import Reaper, ReaperConfig
from app.services.scheduler import Scheduler
from app.services.scheduler_config import SchedulerConfig
from app.settings import Settings
from tests.conftest import TEST_KEY_RING, make_job, make_target
from tests.e2e.test_delivery import drive, get_job, job_state
from tests.problems import assert_problem
from tests.receiver import Received, Receiver, Reply, wait_for


async def get_runs(client: httpx.AsyncClient, auth: dict[str, str], job_id: str) -> list[dict[str, Any]]:
    """Oldest first, asked for by name (an open attempt is then the last entry)."""
    response = await client.get(f"/v1/jobs/{job_id}/runs", params={"order": "asc"}, headers=auth)
    assert response.status_code == 200, response.text
    items: list[dict[str, Any]] = response.json()["items"]
    return items


def _completion_path(receiver: Receiver, index: int = -1) -> str:
    """The completion URL's path from a delivery the receiver got (the API under test is
    in-process, so the URL's host is not dialled)."""
    return urlsplit(receiver.requests[index].headers["cronhook-completion-url"]).path


async def _open_one(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler, **job_fields: Any
) -> tuple[dict[str, Any], dict[str, Any], str]:
    receiver.default = Reply(status=202, body=b"")
    target = await make_target(client, auth, receiver.url(), completion="async", **job_fields)
    job = await make_job(client, auth, target["id"])

    async def opened() -> bool:
        return bool((await get_job(client, auth, job["id"]))["awaiting_completion"])

    await drive(scheduler, opened, message="the 202 leaves the attempt open")
    return target, job, _completion_path(receiver)


async def test_202_opens_the_attempt_and_a_report_finishes_it_with_its_result(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler, engine: AsyncEngine
) -> None:
    target, job, path = await _open_one(client, auth, receiver, scheduler)
    request = receiver.requests[0]
    # The completion URL is signed as the body is: the receiver can check it came from cronhook.
    url = request.headers["cronhook-completion-url"]
    sent_at = dt.datetime.fromtimestamp(int(request.headers["webhook-timestamp"]), dt.UTC)
    expected = Webhook(target["secret"]).sign(request.headers["webhook-id"], sent_at, url)
    assert request.headers["cronhook-completion-signature"] == expected
    shown = await get_job(client, auth, job["id"])
    assert shown["state"] == "running" and shown["deadline_at"] is not None
    runs = await get_runs(client, auth, job["id"])
    assert [r["outcome"] for r in runs] == ["awaiting_completion"]

    beat = await client.post(f"{path}/heartbeat", json={"progress": 40, "message": "halfway"})
    assert beat.status_code == 204, beat.text
    shown = await get_job(client, auth, job["id"])
    assert shown["progress"] == 40 and shown["progress_message"] == "halfway"

    done = await client.post(path, json={"outcome": "succeeded", "result": {"rows": 12}})
    assert done.status_code == 204, done.text
    shown = await get_job(client, auth, job["id"])
    assert shown["state"] == "succeeded" and not shown["awaiting_completion"]
    runs = await get_runs(client, auth, job["id"])
    assert [(r["outcome"], r["result"]) for r in runs] == [("success", {"rows": 12})]

    again = await client.post(path, json={"outcome": "succeeded"})
    assert again.status_code == 409, again.text
    assert again.headers["content-type"].startswith("application/problem+json")
    unknown = await client.post(path[:-4] + "AAAA", json={"outcome": "succeeded"})
    assert unknown.status_code == 404


# -- helpers ---------------------------------------------------------------------------------


async def _open(
    client: httpx.AsyncClient,
    auth: dict[str, str],
    receiver: Receiver,
    scheduler: Scheduler,
    target_fields: dict[str, Any] | None = None,
    job_fields: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], str]:
    """An async job whose first delivery was answered 202: the job and its completion path."""
    receiver.default = Reply(status=202, body=b"")
    target = await make_target(client, auth, receiver.url(), completion="async", **(target_fields or {}))
    job = await make_job(client, auth, target["id"], **(job_fields or {}))
    await drive(scheduler, lambda: awaiting(client, auth, job["id"]), message="the 202 leaves the attempt open")
    return job, _completion_path(receiver)


async def awaiting(client: httpx.AsyncClient, auth: dict[str, str], job_id: str) -> bool:
    return bool((await get_job(client, auth, job_id))["awaiting_completion"])


def _reaper(engine: AsyncEngine) -> Reaper:
    return Reaper(engine, ReaperConfig(), TEST_KEY_RING)


async def _reap_until_ended(engine: AsyncEngine, client: httpx.AsyncClient, auth: dict[str, str], job_id: str) -> None:
    """Reaper passes (as its loop makes them) until the job's open attempt has been failed."""
    reaper = _reaper(engine)

    async def ended() -> bool:
        await reaper.run_once()
        return await job_state(client, auth, job_id) != "running"

    await wait_for(ended, timeout=30, interval=0.2, message="the reaper fails the expired attempt")


def _is_problem(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json"), response.headers
    body: dict[str, Any] = response.json()
    assert body["status"] == status, body
    return body


async def _dead_letters(client: httpx.AsyncClient, auth: dict[str, str], job_id: str) -> list[dict[str, Any]]:
    response = await client.get("/v1/dead-letters", params={"job_id": job_id}, headers=auth)
    assert response.status_code == 200, response.text
    items: list[dict[str, Any]] = response.json()["items"]
    return items


def _token_bytes(path: str) -> bytes:
    token = path.rsplit("/", 1)[1]
    assert token.startswith(TOKEN_PREFIX)
    encoded = token[len(TOKEN_PREFIX) :]
    return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))


def _token_path(raw: bytes) -> str:
    return "/v1/completions/" + TOKEN_PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")


@asynccontextmanager
async def _client_with(settings: Settings, engine: AsyncEngine, **overrides: Any) -> AsyncIterator[httpx.AsyncClient]:
    """An in-process API with some settings changed (its own quotas: a fresh replica)."""
    app = create_app(settings.model_copy(update=overrides), engine=engine)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://cronhook.test") as http:
        yield http


# -- a receiver whose worker threads report over HTTP ------------------------------------------


class Worker:
    """One accepted delivery in a worker thread: reports on its completion URL, over HTTP."""

    def __init__(self, http: httpx.Client, delivery: Received, answers: list[tuple[str, int]]) -> None:
        self.http = http
        self.delivery = delivery
        self.url = delivery.headers["cronhook-completion-url"]
        self.attempt = int(delivery.headers["cronhook-attempt"])
        self._answers = answers

    def heartbeat(self, **body: Any) -> int:
        status = self.http.post(f"{self.url}/heartbeat", json=body).status_code
        self._answers.append(("heartbeat", status))
        return status

    def report(self, **body: Any) -> int:
        status = self.http.post(self.url, json=body).status_code
        self._answers.append(("completion", status))
        return status


Work = Callable[[Worker], None]


def _no_work(worker: Worker) -> None:
    raise AssertionError("a delivery the test did not expect")


class WorkerReceiver:
    """A real HTTP receiver on 127.0.0.1 that accepts every delivery (202) and hands it to a
    new worker thread running `work`, as a service that queues long jobs would. With
    `report_first`, the 202 is sent only once the worker is done (it reports before its own
    202 reaches cronhook)."""

    def __init__(self) -> None:
        self.work: Work = _no_work
        self.report_first = False
        self.requests: list[Received] = []
        # (kind, HTTP status) of every report the workers made, in order (appended by them).
        self.answers: list[tuple[str, int]] = []
        self.errors: list[BaseException] = []
        self.worker_threads: set[int] = set()
        # Set at the end of the test: a worker still waiting gives up.
        self.stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._runner: web.AppRunner | None = None
        self.port = 0

    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("POST", "/hook", self.handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    def until(self, event: threading.Event, timeout: float = 30.0) -> bool:
        """In a worker: waits for the test's go-ahead; False if the test ended first."""
        deadline = time.monotonic() + timeout
        while not self.stop.is_set() and time.monotonic() < deadline:
            if event.wait(0.05):
                return True
        return False

    async def close(self) -> None:
        self.stop.set()
        await self.join()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def join(self) -> None:
        """Waits for every worker thread (off the event loop: they call the API on it)."""
        for thread in list(self._threads):
            await asyncio.to_thread(thread.join, 60)
            assert not thread.is_alive(), "a worker thread did not finish"

    async def handle(self, request: web.Request) -> web.Response:
        headers = {name.lower(): value for name, value in request.headers.items()}
        delivery = Received(request.path, headers, await request.read(), time.time())
        self.requests.append(delivery)
        thread = threading.Thread(target=self._run, args=(delivery,), daemon=True)
        self._threads.append(thread)
        thread.start()
        if self.report_first:
            await asyncio.to_thread(thread.join, 30)
        return web.Response(status=202)

    def _run(self, delivery: Received) -> None:
        self.worker_threads.add(threading.get_ident())
        try:
            with httpx.Client(timeout=10) as http:
                self.work(Worker(http, delivery, self.answers))
        except BaseException as exc:
            self.errors.append(exc)


@asynccontextmanager
async def serving(settings: Settings, engine: AsyncEngine) -> AsyncIterator[str]:
    """The API on a real HTTP server on 127.0.0.1 (uvicorn on this event loop); yields its URL."""
    app = create_app(settings, engine=engine)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    # No logging config of its own (the test's stays), no lifespan (the test owns the engine).
    config = uvicorn.Config(app, lifespan="off", log_config=None, access_log=False, ws="none")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await wait_for(lambda: server.started or task.done(), timeout=30, message="the API server started")
        assert server.started, task
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
        sock.close()


@dataclasses.dataclass
class Rig:
    """The API on a real port, a scheduler whose completion URLs name it, and a receiver with
    worker threads."""

    api_url: str
    receiver: WorkerReceiver
    scheduler: Scheduler


@pytest.fixture
async def rig(settings: Settings, engine: AsyncEngine) -> AsyncIterator[Rig]:
    receiver = WorkerReceiver()
    await receiver.start()
    try:
        async with serving(settings, engine) as api_url:
            config = dataclasses.replace(SchedulerConfig.from_settings(settings), completion_base_url=api_url)
            scheduler = Scheduler(engine, config, TEST_KEY_RING)
            try:
                yield Rig(api_url, receiver, scheduler)
            finally:
                await scheduler.close(grace_s=5)
                # The workers stop before the API they report to.
                await receiver.close()
    finally:
        await receiver.close()
    assert receiver.errors == [], receiver.errors


async def _open_with_workers(
    client: httpx.AsyncClient, auth: dict[str, str], rig: Rig, work: Work, **job_fields: Any
) -> dict[str, Any]:
    rig.receiver.work = work
    target = await make_target(client, auth, rig.receiver.url(), completion="async")
    job = await make_job(client, auth, target["id"], **job_fields)
    await drive(rig.scheduler, lambda: awaiting(client, auth, job["id"]), message="the 202 leaves the attempt open")
    return job


def _check_real_worker(rig: Rig) -> None:
    url = rig.receiver.requests[0].headers["cronhook-completion-url"]
    assert url.startswith(f"{rig.api_url}/v1/completions/{TOKEN_PREFIX}"), url
    assert rig.receiver.worker_threads and threading.get_ident() not in rig.receiver.worker_threads


# -- 1. a worker thread reports over HTTP ----------------------------------------------------------


async def test_a_worker_thread_reports_success_over_http_and_the_result_is_kept(
    client: httpx.AsyncClient, auth: dict[str, str], rig: Rig
) -> None:
    go = threading.Event()
    result = {"rows": 12, "files": ["a.csv", "b.csv"], "checksum": None}

    def work(worker: Worker) -> None:
        if rig.receiver.until(go):  # the work takes a while
            worker.heartbeat(progress=90, message="writing files")
            worker.report(outcome="succeeded", result=result)

    job = await _open_with_workers(client, auth, rig, work)
    shown = await get_job(client, auth, job["id"])
    assert shown["state"] == "running" and shown["awaiting_completion"] and shown["finished_at"] is None
    go.set()

    async def succeeded() -> bool:
        return await job_state(client, auth, job["id"]) == "succeeded"

    await wait_for(succeeded, timeout=30, message="the worker's report finishes the job")
    await rig.receiver.join()
    _check_real_worker(rig)
    assert rig.receiver.answers == [("heartbeat", 204), ("completion", 204)]
    shown = await get_job(client, auth, job["id"])
    assert not shown["awaiting_completion"] and shown["finished_at"] is not None
    (run,) = await get_runs(client, auth, job["id"])
    assert (run["outcome"], run["status_code"], run["result"], run["error"]) == ("success", 202, result, None)
    assert run["reported_at"] is not None and run["fenced_at"] is None
    assert len(rig.receiver.requests) == 1


async def test_a_worker_thread_reports_failed_and_the_one_off_is_dead_lettered_at_once(
    client: httpx.AsyncClient, auth: dict[str, str], rig: Rig
) -> None:
    go = threading.Event()

    def work(worker: Worker) -> None:
        if rig.receiver.until(go):
            worker.report(outcome="failed", error="the export was refused: bad schema")

    # Attempts are left, yet `failed` means no retry.
    job = await _open_with_workers(client, auth, rig, work, max_attempts=5)
    go.set()

    async def dead() -> bool:
        return await job_state(client, auth, job["id"]) == "dead"

    await wait_for(dead, timeout=30, message="a failed report dead-letters the job")
    await rig.receiver.join()
    _check_real_worker(rig)
    assert rig.receiver.answers == [("completion", 204)]
    (run,) = await get_runs(client, auth, job["id"])
    assert (run["outcome"], run["error"], run["attempt"]) == ("failed", "the export was refused: bad schema", 1)
    (letter,) = await _dead_letters(client, auth, job["id"])
    assert letter["attempts"] == 1 and letter["last_error"] == "the export was refused: bad schema"
    # Nothing more is sent for it.
    for _ in range(3):
        await rig.scheduler.run_once()
    assert len(rig.receiver.requests) == 1


async def test_a_worker_thread_asks_for_a_retry_after_a_while_and_the_retry_is_a_new_attempt(
    client: httpx.AsyncClient, auth: dict[str, str], rig: Rig
) -> None:
    go = threading.Event()
    retry_after_s = 2.0

    def work(worker: Worker) -> None:
        if worker.attempt == 1:
            if rig.receiver.until(go):
                worker.report(outcome="retry", retry_after_s=retry_after_s, error="upstream busy")
        else:
            worker.report(outcome="succeeded", result={"attempt": worker.attempt})

    job = await _open_with_workers(client, auth, rig, work, max_attempts=3, backoff_base_s=0.05, backoff_max_s=0.1)
    go.set()

    async def retrying() -> bool:
        return await job_state(client, auth, job["id"]) == "retrying"

    await wait_for(retrying, timeout=30, message="a retry report puts the job back to retrying")
    shown = await get_job(client, auth, job["id"])
    (first_run,) = await get_runs(client, auth, job["id"])
    assert (first_run["outcome"], first_run["error"]) == ("failed", "upstream busy")
    next_run_at = dt.datetime.fromisoformat(shown["next_run_at"])
    reported_at = dt.datetime.fromisoformat(first_run["reported_at"])
    # The backoff is far shorter: retry_after_s sets the least wait (both on the database's clock).
    assert next_run_at >= reported_at + dt.timedelta(seconds=retry_after_s), (next_run_at, reported_at)

    async def succeeded() -> bool:
        return await job_state(client, auth, job["id"]) == "succeeded"

    await drive(rig.scheduler, succeeded, message="the retry is delivered and reported on")
    await rig.receiver.join()
    first, second = rig.receiver.requests
    assert second.at >= next_run_at.timestamp() - 0.05  # not before the receiver asked
    assert second.headers["cronhook-attempt"] == "2"
    # The same occurrence (receivers dedupe on it); a new attempt with a token of its own.
    assert second.headers["webhook-id"] == first.headers["webhook-id"]
    assert second.headers["cronhook-completion-url"] != first.headers["cronhook-completion-url"]
    assert rig.receiver.answers == [("completion", 204), ("completion", 204)]
    runs = await get_runs(client, auth, job["id"])
    assert [(r["attempt"], r["outcome"], r["result"]) for r in runs] == [
        (1, "failed", None),
        (2, "success", {"attempt": 2}),
    ]


# -- 2. heartbeats keep a long run alive ---------------------------------------------------------

LONG_RUN_S = 120.0
HEARTBEAT_TIMEOUT_S = 5
HEARTBEAT_EVERY_S = 2.0
REAPER_EVERY_S = 1.0


# Slow by design: two minutes of heartbeats (the default limit leaves too little room for it).
@pytest.mark.long
@pytest.mark.timeout(LONG_RUN_S + 120)
async def test_heartbeats_keep_a_two_minute_run_alive_far_past_its_heartbeat_timeout(
    client: httpx.AsyncClient, auth: dict[str, str], rig: Rig, engine: AsyncEngine
) -> None:
    def work(worker: Worker) -> None:
        started = time.monotonic()
        beats = 0
        while time.monotonic() - started < LONG_RUN_S:
            beats += 1
            worker.heartbeat(progress=min(99, int(100 * (time.monotonic() - started) / LONG_RUN_S)), message=f"{beats}")
            if rig.receiver.stop.wait(HEARTBEAT_EVERY_S):
                return
        worker.report(outcome="succeeded", result={"heartbeats": beats})

    rig.receiver.work = work
    target = await make_target(
        client,
        auth,
        rig.receiver.url(),
        completion="async",
        async_timeout_s=600,
        heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S,
    )
    job = await make_job(client, auth, target["id"])
    await drive(rig.scheduler, lambda: awaiting(client, auth, job["id"]), message="the 202 leaves the attempt open")

    # The reaper runs every second throughout, as its loop would; it must never fail the attempt.
    reaper = _reaper(engine)
    passes = 0
    heartbeat_deadlines: set[str] = set()
    give_up = time.monotonic() + LONG_RUN_S + 60
    while (shown := await get_job(client, auth, job["id"]))["state"] == "running":
        assert shown["awaiting_completion"], shown
        deadline_at, heartbeat_deadline_at = shown["deadline_at"], shown["heartbeat_deadline_at"]
        assert dt.datetime.fromisoformat(heartbeat_deadline_at) <= dt.datetime.fromisoformat(deadline_at)
        heartbeat_deadlines.add(heartbeat_deadline_at)
        reaped = await reaper.run_once()
        assert (reaped.rescued, reaped.dead_lettered) == (0, 0), "the reaper failed a heartbeating attempt"
        passes += 1
        assert time.monotonic() < give_up, "the worker never reported"
        await asyncio.sleep(REAPER_EVERY_S)

    assert shown["state"] == "succeeded", shown
    await rig.receiver.join()
    beats = [status for kind, status in rig.receiver.answers if kind == "heartbeat"]
    assert beats and all(status == 204 for status in beats), rig.receiver.answers
    assert rig.receiver.answers[-1] == ("completion", 204)
    assert len(beats) >= LONG_RUN_S / HEARTBEAT_EVERY_S * 0.9
    # Many reaper passes found the attempt open, and each heartbeat pushed its deadline on.
    # Each pass also reads the job and sleeps REAPER_EVERY_S: on a loaded CI box a pass took
    # over 1.3 s (88 in the two minutes). Half the passes a free second would allow still has
    # the reaper look at the open attempt every few seconds, far past its heartbeat timeout.
    assert passes >= LONG_RUN_S / REAPER_EVERY_S * 0.5, passes
    assert len(heartbeat_deadlines) >= 10
    (run,) = await get_runs(client, auth, job["id"])
    assert run["outcome"] == "success" and run["result"] == {"heartbeats": len(beats)}
    assert run["duration_ms"] >= LONG_RUN_S * 1000 > 20 * HEARTBEAT_TIMEOUT_S * 1000
    assert len(rig.receiver.requests) == 1


# -- 3. timeouts ---------------------------------------------------------------------------------


async def test_a_missed_heartbeat_fails_the_attempt_and_the_retry_gets_a_new_token(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler, engine: AsyncEngine
) -> None:
    job, old = await _open(
        client,
        auth,
        receiver,
        scheduler,
        target_fields={"async_timeout_s": 600, "heartbeat_timeout_s": 1},
        job_fields={"max_attempts": 3, "backoff_base_s": 0.05, "backoff_max_s": 0.1},
    )
    assert receiver.requests[0].headers["cronhook-heartbeat-timeout"] == "1"
    assert (await client.post(f"{old}/heartbeat", json={"progress": 5})).status_code == 204
    # Then the receiver goes quiet.
    await _reap_until_ended(engine, client, auth, job["id"])
    (timed_out,) = await get_runs(client, auth, job["id"])
    assert (timed_out["outcome"], timed_out["status_code"], timed_out["attempt"]) == ("heartbeat_timeout", 202, 1)
    assert "heartbeat_timeout_s (1 s)" in timed_out["error"] and timed_out["fenced_at"] is None
    assert await job_state(client, auth, job["id"]) == "retrying"

    await drive(
        scheduler,
        lambda: len(receiver.requests) == 2 and awaiting(client, auth, job["id"]),
        message="the retry is delivered and left open",
    )
    first, second = receiver.requests
    new = _completion_path(receiver)
    assert new != old and second.headers["cronhook-attempt"] == "2"
    assert second.headers["webhook-id"] == first.headers["webhook-id"]
    runs = await get_runs(client, auth, job["id"])
    assert [(r["id"] == 0, r["outcome"], r["attempt"], r["finished_at"]) for r in runs] == [
        (False, "heartbeat_timeout", 1, timed_out["finished_at"]),
        (True, "awaiting_completion", 2, None),
    ]
    assert runs[-1]["deadline_at"] is not None

    # The old token is fenced: heartbeats and reports are refused, and its run says so.
    body = _is_problem(await client.post(f"{old}/heartbeat", json={"progress": 50}), 410)
    assert body["outcome"] == "heartbeat_timeout"
    _is_problem(await client.post(old, json={"outcome": "succeeded"}), 410)
    fenced = (await get_runs(client, auth, job["id"]))[0]
    assert fenced["fenced_at"] is not None and fenced["outcome"] == "heartbeat_timeout"
    # ... and touched nothing of the open attempt.
    shown = await get_job(client, auth, job["id"])
    assert shown["awaiting_completion"] and shown["attempt"] == 2 and shown["progress"] is None

    assert (await client.post(new, json={"outcome": "succeeded"})).status_code == 204
    assert await job_state(client, auth, job["id"]) == "succeeded"
    runs = await get_runs(client, auth, job["id"])
    assert [(r["outcome"], r["fenced_at"] is not None) for r in runs] == [
        ("heartbeat_timeout", True),
        ("success", False),
    ]


async def test_heartbeats_never_carry_an_attempt_past_async_timeout_s(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler, engine: AsyncEngine
) -> None:
    job, path = await _open(
        client,
        auth,
        receiver,
        scheduler,
        target_fields={"async_timeout_s": 2, "heartbeat_timeout_s": 2},
        job_fields={"max_attempts": 1},
    )
    assert receiver.requests[0].headers["cronhook-completion-timeout"] == "2"
    reaper = _reaper(engine)

    async def beat_until_failed() -> bool:
        # A receiver that keeps saying it is alive, and a reaper that keeps looking.
        beat = await client.post(f"{path}/heartbeat", json={})
        shown = await get_job(client, auth, job["id"])
        if shown["state"] == "running":
            assert beat.status_code == 204, beat.text
            heartbeat_deadline_at = dt.datetime.fromisoformat(shown["heartbeat_deadline_at"])
            assert heartbeat_deadline_at <= dt.datetime.fromisoformat(shown["deadline_at"]), shown
        await reaper.run_once()
        return await job_state(client, auth, job["id"]) != "running"

    await wait_for(beat_until_failed, timeout=30, interval=0.3, message="the deadline ends the attempt")
    shown = await get_job(client, auth, job["id"])
    assert shown["state"] == "dead" and not shown["awaiting_completion"]
    (run,) = await get_runs(client, auth, job["id"])
    assert (run["outcome"], run["status_code"]) == ("async_timeout", 202)
    assert "async_timeout_s (2 s)" in run["error"] and run["duration_ms"] >= 2000
    (letter,) = await _dead_letters(client, auth, job["id"])
    assert letter["attempts"] == 1
    body = _is_problem(await client.post(path, json={"outcome": "succeeded"}), 410)
    assert body["outcome"] == "async_timeout"
    assert (await get_runs(client, auth, job["id"]))[0]["fenced_at"] is not None
    assert await job_state(client, auth, job["id"]) == "dead"


# -- 4. cancel -------------------------------------------------------------------------------------


async def test_cancelling_a_job_with_an_open_attempt_ends_it_with_a_run_and_fences_its_token(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler
) -> None:
    job, path = await _open(client, auth, receiver, scheduler)
    assert (await client.post(f"{path}/heartbeat", json={"progress": 30})).status_code == 204
    cancelled = await client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth)
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["state"] == "cancelled" and not cancelled.json()["awaiting_completion"]
    (run,) = await get_runs(client, auth, job["id"])
    assert (run["outcome"], run["status_code"], run["attempt"]) == ("cancelled", 202, 1)
    assert run["finished_at"] is not None and run["fenced_at"] is None

    body = _is_problem(await client.post(path, json={"outcome": "succeeded", "result": {"late": True}}), 410)
    assert body["outcome"] == "cancelled"
    _is_problem(await client.post(f"{path}/heartbeat", json={"progress": 90}), 410)
    (run,) = await get_runs(client, auth, job["id"])
    assert run["outcome"] == "cancelled" and run["fenced_at"] is not None and run["result"] is None
    assert await job_state(client, auth, job["id"]) == "cancelled"
    for _ in range(3):
        await scheduler.run_once()
    assert len(receiver.requests) == 1


# -- 5. max_in_flight ------------------------------------------------------------------------------


async def _open_count(client: httpx.AsyncClient, auth: dict[str, str], job_ids: list[str]) -> int:
    return sum([await awaiting(client, auth, job_id) for job_id in job_ids])


async def _open_count_is(client: httpx.AsyncClient, auth: dict[str, str], job_ids: list[str], count: int) -> bool:
    return await _open_count(client, auth, job_ids) == count


async def test_open_async_attempts_count_against_max_in_flight(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler
) -> None:
    receiver.default = Reply(status=202, body=b"")
    target = await make_target(client, auth, receiver.url(), completion="async", max_in_flight=2)
    ids = [(await make_job(client, auth, target["id"]))["id"] for _ in range(5)]

    async def settled(delivered: int) -> None:
        async def two_open() -> bool:
            return len(receiver.requests) >= delivered and await _open_count(client, auth, ids) == 2

        await drive(scheduler, two_open, message=f"{delivered} deliveries, two open")
        # More passes (each claims everything it may) send nothing more while two are open.
        for _ in range(5):
            await scheduler.run_once()
        assert len(receiver.requests) == delivered
        assert await _open_count(client, auth, ids) == 2

    await settled(2)
    reported: set[str] = set()
    for delivered in (3, 4, 5):
        # One open attempt finishes: one more job may go.
        path = next(p for p in (_completion_path(receiver, i) for i in range(delivered - 1)) if p not in reported)
        assert (await client.post(path, json={"outcome": "succeeded"})).status_code == 204
        reported.add(path)
        if delivered < 5:
            await settled(delivered)
        else:
            await drive(scheduler, lambda: len(receiver.requests) == 5, message="the last delivery")
    assert len(set(receiver.webhook_ids())) == 5
    assert sorted(r.headers["cronhook-job-id"] for r in receiver.requests) == sorted(ids)


async def test_open_attempts_do_not_count_when_the_target_says_so(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler
) -> None:
    receiver.default = Reply(status=202, body=b"")
    target = await make_target(
        client, auth, receiver.url(), completion="async", max_in_flight=2, async_counts_in_flight=False
    )
    assert target["async_counts_in_flight"] is False
    ids = [(await make_job(client, auth, target["id"]))["id"] for _ in range(5)]

    async def all_open() -> bool:
        return await _open_count(client, auth, ids) == 5

    await drive(scheduler, all_open, message="every job delivered and left open")
    assert len(receiver.requests) == 5 and len(set(receiver.webhook_ids())) == 5


# -- 6. refusals -----------------------------------------------------------------------------------


async def test_unknown_and_tampered_tokens_are_404_and_too_many_from_one_address_are_429(
    client: httpx.AsyncClient,
    auth: dict[str, str],
    receiver: Receiver,
    scheduler: Scheduler,
    settings: Settings,
    engine: AsyncEngine,
) -> None:
    job, path = await _open(client, auth, receiver, scheduler)
    middle = len(path) - 40  # inside the nonce: the MAC no longer matches
    tampered = path[:middle] + ("A" if path[middle] != "A" else "B") + path[middle + 1 :]
    async with _client_with(settings, engine, failed_auth_per_min=3) as reports:
        for bad in ("/v1/completions/" + TOKEN_PREFIX + "AAAA", "/v1/completions/not-a-token", tampered):
            _is_problem(await reports.post(bad, json={"outcome": "succeeded"}), 404)
        # Counted against the address: now even a good token from it is held off.
        throttled = await reports.post(path, json={"outcome": "succeeded"})
        _is_problem(throttled, 429)
        assert int(throttled.headers["Retry-After"]) >= 1
        _is_problem(await reports.post(f"{path}/heartbeat", json={}), 429)
    shown = await get_job(client, auth, job["id"])
    assert shown["awaiting_completion"] and shown["last_heartbeat_at"] is None


async def test_one_token_may_report_only_so_often_and_others_are_not_held_back(
    client: httpx.AsyncClient,
    auth: dict[str, str],
    receiver: Receiver,
    scheduler: Scheduler,
    settings: Settings,
    engine: AsyncEngine,
) -> None:
    receiver.default = Reply(status=202, body=b"")
    target = await make_target(client, auth, receiver.url(), completion="async")
    ids = [(await make_job(client, auth, target["id"]))["id"] for _ in range(2)]
    await drive(scheduler, lambda: _open_count_is(client, auth, ids, 2), message="both open")
    chatty, quiet = _completion_path(receiver, 0), _completion_path(receiver, 1)
    async with _client_with(settings, engine, completion_reports_per_min=3) as reports:
        for progress in (10, 20, 30):
            assert (await reports.post(f"{chatty}/heartbeat", json={"progress": progress})).status_code == 204
        throttled = await reports.post(f"{chatty}/heartbeat", json={"progress": 40})
        _is_problem(throttled, 429)
        assert int(throttled.headers["Retry-After"]) >= 1
        _is_problem(await reports.post(chatty, json={"outcome": "succeeded"}), 429)
        # Another attempt's token has its own allowance.
        assert (await reports.post(quiet, json={"outcome": "succeeded"})).status_code == 204
    chatty_job = receiver.requests[0].headers["cronhook-job-id"]
    shown = await get_job(client, auth, chatty_job)
    assert shown["awaiting_completion"] and shown["progress"] == 30
    # The default allowance (another API replica's) takes the report.
    assert (await client.post(chatty, json={"outcome": "succeeded"})).status_code == 204
    assert [await job_state(client, auth, job_id) for job_id in ids] == ["succeeded", "succeeded"]


async def test_a_report_after_a_synchronous_success_is_a_conflict(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler
) -> None:
    receiver.default = Reply(status=200)  # done at once: no need to report
    target = await make_target(client, auth, receiver.url(), completion="async")
    job = await make_job(client, auth, target["id"])

    async def succeeded() -> bool:
        return await job_state(client, auth, job["id"]) == "succeeded"

    await drive(scheduler, succeeded, message="a 200 is a synchronous success")
    path = _completion_path(receiver)
    body = _is_problem(await client.post(path, json={"outcome": "failed"}), 409)
    assert body["outcome"] == "success"
    _is_problem(await client.post(f"{path}/heartbeat", json={}), 409)
    (run,) = await get_runs(client, auth, job["id"])
    assert (run["outcome"], run["status_code"], run["fenced_at"]) == ("success", 200, None)
    assert await job_state(client, auth, job["id"]) == "succeeded"


async def test_a_result_over_64_kib_is_413_and_one_at_the_limit_is_kept(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler
) -> None:
    job, path = await _open(client, auth, receiver, scheduler)
    # A JSON string: its two quotes count.
    over = await client.post(path, json={"outcome": "succeeded", "result": "x" * (MAX_RESULT_BYTES - 1)})
    assert_problem(over, 413, "result")
    assert await awaiting(client, auth, job["id"])
    at_limit = "x" * (MAX_RESULT_BYTES - 2)
    assert (await client.post(path, json={"outcome": "succeeded", "result": at_limit})).status_code == 204
    (run,) = await get_runs(client, auth, job["id"])
    assert run["outcome"] == "success" and run["result"] == at_limit


BAD_REPORTS = [
    ("heartbeat", {"progress": 101}, "progress"),
    ("heartbeat", {"progress": -1}, "progress"),
    ("heartbeat", {"progress": "50"}, "progress"),
    ("heartbeat", {"message": "m" * 201}, "message"),
    ("heartbeat", {"progress": 5, "eta_s": 60}, "eta_s"),
    ("completion", {"outcome": "maybe"}, "outcome"),
    ("completion", {}, "outcome"),
    ("completion", {"outcome": "failed", "error": "e" * 1001}, "error"),
    ("completion", {"outcome": "retry", "retry_after_s": -1}, "retry_after_s"),
    ("completion", {"outcome": "succeeded", "status": "done"}, "status"),
]


async def test_bad_reports_are_422_naming_the_field_and_change_nothing(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler
) -> None:
    job, path = await _open(client, auth, receiver, scheduler)
    before = await get_job(client, auth, job["id"])
    for kind, body, field in BAD_REPORTS:
        url = f"{path}/heartbeat" if kind == "heartbeat" else path
        assert_problem(await client.post(url, json=body), 422, field)
    after = await get_job(client, auth, job["id"])
    assert after == before
    assert [r["outcome"] for r in await get_runs(client, auth, job["id"])] == ["awaiting_completion"]
    # The token still works.
    assert (await client.post(path, json={"outcome": "succeeded"})).status_code == 204


async def test_a_token_reports_only_on_its_own_attempt(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler
) -> None:
    receiver.default = Reply(status=202, body=b"")
    target = await make_target(client, auth, receiver.url(), completion="async")
    a = (await make_job(client, auth, target["id"]))["id"]
    b = (await make_job(client, auth, target["id"]))["id"]
    await drive(scheduler, lambda: _open_count_is(client, auth, [a, b], 2), message="both open")
    paths = {
        r.headers["cronhook-job-id"]: urlsplit(r.headers["cronhook-completion-url"]).path for r in receiver.requests
    }
    raw_a = _token_bytes(paths[a])
    # A's token with B's job id (its lease, nonce and MAC kept): the MAC no longer matches.
    forged = _token_path(uuid.UUID(b).bytes + raw_a[16:])
    _is_problem(await client.post(forged, json={"outcome": "failed"}), 404)
    _is_problem(await client.post(f"{forged}/heartbeat", json={"progress": 99}), 404)
    assert (await client.post(paths[a], json={"outcome": "failed", "error": "A only"})).status_code == 204
    assert await job_state(client, auth, a) == "dead"
    shown_b = await get_job(client, auth, b)
    assert shown_b["state"] == "running" and shown_b["awaiting_completion"] and shown_b["progress"] is None
    assert [r["outcome"] for r in await get_runs(client, auth, b)] == ["awaiting_completion"]
    assert (await client.post(paths[b], json={"outcome": "succeeded"})).status_code == 204
    assert [await job_state(client, auth, job_id) for job_id in (a, b)] == ["dead", "succeeded"]


# -- 7. a report before the 202 ------------------------------------------------------------------


async def test_a_report_made_before_the_202_is_recorded_wins_and_the_job_finishes_once(
    client: httpx.AsyncClient, auth: dict[str, str], rig: Rig
) -> None:
    def work(worker: Worker) -> None:
        # Inside the receiver's handler, before it answers 202.
        worker.report(outcome="succeeded", result={"quick": True})

    rig.receiver.work = work
    rig.receiver.report_first = True
    target = await make_target(client, auth, rig.receiver.url(), completion="async")
    job = await make_job(client, auth, target["id"])

    async def succeeded() -> bool:
        return await job_state(client, auth, job["id"]) == "succeeded"

    await drive(rig.scheduler, succeeded, message="the early report finishes the job")
    for _ in range(3):
        await rig.scheduler.run_once()
    await rig.receiver.join()
    _check_real_worker(rig)
    assert rig.receiver.answers == [("completion", 204)]
    shown = await get_job(client, auth, job["id"])
    assert shown["state"] == "succeeded" and not shown["awaiting_completion"]
    (run,) = await get_runs(client, auth, job["id"])
    assert (run["outcome"], run["result"]) == ("success", {"quick": True}) and run["reported_at"] is not None
    assert len(rig.receiver.requests) == 1


async def test_a_heartbeat_before_the_202_is_kept_and_the_attempt_then_opens(
    client: httpx.AsyncClient, auth: dict[str, str], rig: Rig
) -> None:
    def work(worker: Worker) -> None:
        worker.heartbeat(progress=10, message="queued")

    rig.receiver.work = work
    rig.receiver.report_first = True
    target = await make_target(client, auth, rig.receiver.url(), completion="async", heartbeat_timeout_s=600)
    job = await make_job(client, auth, target["id"])
    await drive(rig.scheduler, lambda: awaiting(client, auth, job["id"]), message="the 202 leaves the attempt open")
    await rig.receiver.join()
    assert rig.receiver.answers == [("heartbeat", 204)]
    shown = await get_job(client, auth, job["id"])
    assert (shown["progress"], shown["progress_message"]) == (10, "queued")
    assert shown["last_heartbeat_at"] is not None
    heartbeat_deadline_at = dt.datetime.fromisoformat(shown["heartbeat_deadline_at"])
    assert heartbeat_deadline_at <= dt.datetime.fromisoformat(shown["deadline_at"])
    path = urlsplit(rig.receiver.requests[0].headers["cronhook-completion-url"]).path
    assert (await client.post(path, json={"outcome": "succeeded"})).status_code == 204
    assert [r["outcome"] for r in await get_runs(client, auth, job["id"])] == ["success"]


async def test_a_token_minted_for_the_attempt_but_never_delivered_is_unknown_to_both_routes(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler
) -> None:
    """A token with a good MAC for the attempt's job and lease, but not the one its delivery
    carried (recorded with the 202), is refused as unknown by both routes; the attempt stays open."""
    job, path = await _open(client, auth, receiver, scheduler)
    raw = _token_bytes(path)
    # Only a holder of the key ring can mint one: the same job and lease, another nonce.
    other = mint_token(TEST_KEY_RING.mac_keys[0], uuid.UUID(bytes=raw[:16]), uuid.UUID(bytes=raw[16:32]))
    minted = f"/v1/completions/{other.text}"
    _is_problem(await client.post(minted, json={"outcome": "succeeded"}), 404)
    assert await awaiting(client, auth, job["id"])
    _is_problem(await client.post(f"{minted}/heartbeat", json={"progress": 3}), 404)
