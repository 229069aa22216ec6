"""Asynchronous completion end to end (app/domain/completion.py): a real receiver on
127.0.0.1 answers 202, then reports heartbeats and the outcome on the completion URL the
delivery carried, through the API."""

from __future__ import annotations

import datetime as dt
from typing import Any
from urllib.parse import urlsplit

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine
from standardwebhooks.webhooks import Webhook

from app.services.scheduler import Scheduler
from tests.conftest import make_job, make_target
from tests.e2e.test_delivery import drive, get_job, get_runs
from tests.receiver import Receiver, Reply


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
