"""The client verbs of `cronhook` against a live server, as a user runs them from a shell."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from app.client.commands import RESULT_CHARS
from tests.e2e.live_server import LiveServer, live_server
from tests.e2e.test_processes import CRONHOOK, Processes, base_env
from tests.receiver import Receiver, Reply, wait_for

pytestmark = pytest.mark.e2e


async def cli(server: LiveServer, *args: str, expect: int = 0) -> tuple[str, str]:
    env = base_env(CRONHOOK_URL=server.url, CRONHOOK_API_KEY=server.key)
    proc = await asyncio.create_subprocess_exec(
        CRONHOOK, *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await proc.communicate()
    assert proc.returncode == expect, (args, out, err)
    return out.decode(), err.decode()


async def cli_json(server: LiveServer, *args: str) -> Any:
    out, _ = await cli(server, *args, "--json")
    return json.loads(out)


async def test_the_client_verbs_drive_a_live_server(receiver: Receiver, db_url: str, procs: Processes) -> None:
    async with live_server(procs, db_url) as server:
        target = await cli_json(server, "targets", "create", "--name", "hooks", "--url", receiver.url())
        assert target["secret"].startswith("whsec_")
        table, _ = await cli(server, "targets", "list")
        header = ["id", "name", "url", "timeout_s", "max_in_flight", "rate_per_s", "completion"]
        assert table.splitlines()[0].split() == header
        assert target["id"] in table and receiver.url() in table and table.splitlines()[2].rstrip().endswith("sync")
        rotated = await cli_json(server, "targets", "rotate-secret", target["id"])
        assert rotated["secret"] != target["secret"]

        cron = await cli_json(
            server, "jobs", "create", "--target", target["id"], "--cron", "0 9 * * 1", "--timezone", "Europe/Paris",
            "--name", "weekly", "--payload", '{"report": "weekly"}',
        )  # fmt: skip
        assert (cron["state"], cron["payload"]) == ("scheduled", {"report": "weekly"})
        paused = await cli_json(server, "jobs", "pause", cron["id"])
        assert paused["state"] == "paused"
        assert (await cli_json(server, "jobs", "resume", cron["id"]))["state"] == "scheduled"
        triggered = await cli_json(server, "jobs", "trigger", cron["id"])
        assert triggered["parent_job_id"] == cron["id"]
        await wait_for(lambda: len(receiver.requests) == 1, timeout=20, message="the triggered delivery")

        async def child_succeeded() -> bool:
            state: str = (await cli_json(server, "jobs", "get", triggered["id"]))["state"]
            return state == "succeeded"

        await wait_for(child_succeeded, timeout=10, interval=0.2, message="trigger recorded")
        runs = await cli_json(server, "jobs", "runs", triggered["id"])
        assert [(r["attempt"], r["outcome"], r["status_code"]) for r in runs["items"]] == [(1, "success", 200)]
        assert runs["next_cursor"] is None

        detail, _ = await cli(server, "jobs", "get", cron["id"])
        assert "cron 0 9 * * 1 Europe/Paris" in detail and "weekly" in detail
        listed = await cli_json(server, "jobs", "list", "--state", "scheduled")
        assert [j["id"] for j in listed["items"]] == [cron["id"]] and listed["next_cursor"] is None
        cancelled = await cli_json(server, "jobs", "cancel", cron["id"])
        assert cancelled["state"] == "cancelled"
        _, err = await cli(server, "jobs", "cancel", cron["id"], expect=1)
        assert err.strip() == f"cronhook: {server.url} answered 409 Conflict: job is already cancelled"

        # A dead letter, listed and replayed one by one and in bulk.
        receiver.default = Reply(status=410)
        doomed = await cli_json(server, "jobs", "create", "--target", target["id"], "--max-attempts", "1")

        async def dead_letters() -> list[Any]:
            found: list[Any] = (await cli_json(server, "dead-letters", "list", "--job", doomed["id"]))["items"]
            return found

        await wait_for(dead_letters, timeout=20, interval=0.3, message="a dead letter")
        (letter,) = await dead_letters()
        replayed = await cli_json(server, "dead-letters", "replay", letter["id"])
        assert replayed["id"] != doomed["id"] and replayed["target_id"] == target["id"]
        bulk, _ = await cli(server, "dead-letters", "replay", "--all", "--include-replayed")
        assert letter["id"] in bulk

        preview = await cli_json(server, "schedules", "preview", "0 0 29 2 *", "--count", "2")
        assert [f["at"][5:10] for f in preview["fire_times"]] == ["02-29", "02-29"]

        _, err = await cli(server, "jobs", "create", "--target", target["id"], "--cron", "61 * * * *", expect=1)
        assert err.startswith(f"cronhook: {server.url} answered 422 Unprocessable Content: ")
        env_without_key = base_env(CRONHOOK_URL=server.url)
        proc = await asyncio.create_subprocess_exec(
            CRONHOOK, "jobs", "list", env=env_without_key, stderr=asyncio.subprocess.PIPE
        )
        _, err_bytes = await proc.communicate()
        assert proc.returncode == 1 and f"{server.url} answered 401".encode() in err_bytes
        assert b"no API key given: set CRONHOOK_API_KEY" in err_bytes


def _field(detail: str, name: str) -> str:
    """A field of a one-object table (`name  value`)."""
    for line in detail.splitlines():
        key, _, value = line.partition(" ")
        if key == name:
            return value.strip()
    raise AssertionError(f"no {name} in {detail!r}")


async def test_async_completion_in_the_client_verbs(receiver: Receiver, db_url: str, procs: Processes) -> None:
    receiver.default = Reply(status=202, body=b"")
    async with live_server(procs, db_url) as server, httpx.AsyncClient() as http:
        target = await cli_json(
            server, "targets", "create", "--name", "exports", "--url", receiver.url(), "--completion", "async",
            "--async-timeout", "600", "--heartbeat-timeout", "300", "--async-outside-in-flight",
        )  # fmt: skip
        assert (target["completion"], target["async_timeout_s"], target["heartbeat_timeout_s"]) == ("async", 600, 300)
        assert target["async_counts_in_flight"] is False
        table, _ = await cli(server, "targets", "list")
        assert "async (timeout 600s, heartbeat 300s, not counted in max_in_flight)" in table

        detail, _ = await cli(
            server, "jobs", "create", "--target", target["id"], "--name", "export", "--completion", "async",
            "--async-timeout", "120", "--heartbeat-timeout", "60",
        )  # fmt: skip
        assert _field(detail, "completion") == "async (timeout 120s, heartbeat 60s)"
        job_id = _field(detail, "id")

        async def awaiting() -> bool:
            return bool((await cli_json(server, "jobs", "get", job_id))["awaiting_completion"])

        await wait_for(awaiting, timeout=20, interval=0.2, message="the 202 leaves the attempt open")
        url = receiver.requests[0].headers["cronhook-completion-url"]
        assert url.startswith(f"{server.url}/v1/completions/")
        beat = await http.post(f"{url}/heartbeat", json={"progress": 40, "message": "halfway"})
        assert beat.status_code == 204, beat.text

        job = await cli_json(server, "jobs", "get", job_id)
        detail, _ = await cli(server, "jobs", "get", job_id)
        assert _field(detail, "state") == "running"
        open_attempt = _field(detail, "open_attempt")
        assert open_attempt.startswith(f'awaiting_completion 40% "halfway" deadline {job["deadline_at"]}')
        assert f"last heartbeat {job['last_heartbeat_at']}" in open_attempt
        runs_table, _ = await cli(server, "jobs", "runs", job_id)
        lines = runs_table.splitlines()
        assert lines[0].split()[:4] == ["scheduled_for", "attempt", "outcome", "report"]
        assert f'awaiting_completion  40% "halfway" deadline {job["deadline_at"]}' in lines[2]

        rows = [{"row": i, "status": "exported"} for i in range(10)]
        done = await http.post(url, json={"outcome": "succeeded", "result": {"rows": rows}})
        assert done.status_code == 204, done.text
        detail, _ = await cli(server, "jobs", "get", job_id)
        assert _field(detail, "state") == "succeeded" and "open_attempt" not in detail
        runs_table, _ = await cli(server, "jobs", "runs", job_id)
        (row,) = runs_table.splitlines()[2:]
        # The result, abbreviated in the table; whole with --json.
        shown = json.dumps({"rows": rows}, separators=(",", ":"))[: RESULT_CHARS - 3] + "..."
        assert f"success  result {shown}  202" in row
        (run,) = (await cli_json(server, "jobs", "runs", job_id))["items"]
        assert (run["outcome"], run["result"]) == ("success", {"rows": rows})


async def test_version() -> None:
    proc = await asyncio.create_subprocess_exec(CRONHOOK, "--version", stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    assert proc.returncode == 0 and out.decode().startswith("cronhook ")
