"""The client verbs of `cronhook` against a live server, as a user runs them from a shell."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

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
        assert table.splitlines()[0].split() == ["id", "name", "url", "timeout_s", "max_in_flight", "rate_per_s"]
        assert target["id"] in table and receiver.url() in table
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
        assert [(r["attempt"], r["outcome"], r["status_code"]) for r in runs] == [(1, "success", 200)]

        detail, _ = await cli(server, "jobs", "get", cron["id"])
        assert "cron 0 9 * * 1 Europe/Paris" in detail and "weekly" in detail
        listed = await cli_json(server, "jobs", "list", "--state", "scheduled")
        assert [j["id"] for j in listed] == [cron["id"]]
        cancelled = await cli_json(server, "jobs", "cancel", cron["id"])
        assert cancelled["state"] == "cancelled"
        _, err = await cli(server, "jobs", "cancel", cron["id"], expect=1)
        assert err.strip() == "cronhook: 409 Conflict: job is already cancelled"

        # A dead letter, listed and replayed one by one and in bulk.
        receiver.default = Reply(status=410)
        doomed = await cli_json(server, "jobs", "create", "--target", target["id"], "--max-attempts", "1")

        async def dead_letters() -> list[Any]:
            found: list[Any] = await cli_json(server, "dead-letters", "list", "--job", doomed["id"])
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
        assert err.startswith("cronhook: 422 Unprocessable Content: ")
        env_without_key = base_env(CRONHOOK_URL=server.url)
        proc = await asyncio.create_subprocess_exec(
            CRONHOOK, "jobs", "list", env=env_without_key, stderr=asyncio.subprocess.PIPE
        )
        _, err_bytes = await proc.communicate()
        assert proc.returncode == 1 and b"401" in err_bytes and b"CRONHOOK_API_KEY" in err_bytes


async def test_version() -> None:
    proc = await asyncio.create_subprocess_exec(CRONHOOK, "--version", stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    assert proc.returncode == 0 and out.decode().startswith("cronhook ")
