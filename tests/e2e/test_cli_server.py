"""The `cronhook` client against the server it names, as a user runs it from a shell: health
and api-key verbs ask the server of CRONHOOK_URL/--server (never a stray one), every error
names that server and exits with the documented status, lists say when they are cut, runs
come newest first, a closed pipe ends quietly, and the verbs the API has are all there."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.live_server import LiveServer, live_server
from tests.e2e.test_processes import CRONHOOK, Processes, base_env, free_port
from tests.receiver import Receiver, Reply, wait_for

pytestmark = pytest.mark.e2e

CLI_TIMEOUT_S = 60.0


async def run(
    env: dict[str, str], *args: str, stdin: bytes | None = None, cwd: Path | None = None
) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        CRONHOOK,
        *args,
        env=env,
        cwd=cwd,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(stdin), CLI_TIMEOUT_S)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def client_env(server: LiveServer, **more: str) -> dict[str, str]:
    return base_env(CRONHOOK_URL=server.url, CRONHOOK_API_KEY=server.key, **more)


async def ok(server: LiveServer, *args: str, stdin: bytes | None = None) -> str:
    code, out, err = await run(client_env(server), *args, stdin=stdin)
    assert code == 0, (args, out, err)
    return out


async def ok_json(server: LiveServer, *args: str, stdin: bytes | None = None) -> Any:
    return json.loads(await ok(server, *args, "--json", stdin=stdin))


# -- health asks the server it is told to ----------------------------------------------------------


async def test_health_probes_the_named_server_not_whatever_listens_on_the_local_port(
    db_url: str, procs: Processes, receiver: Receiver
) -> None:
    decoy = Receiver()  # another server on the port `health` used to probe whatever it was told
    await decoy.start()
    try:
        async with live_server(procs, db_url) as server:
            local = {"CRONHOOK_PORT": str(decoy.port)}
            receiver.default = Reply(status=503, body=b'{"reason": "database unreachable"}')
            sick = receiver.url("")

            # The named server is sick, the local one healthy: unhealthy, and it says which.
            decoy.default = Reply(status=200)
            code, _, err = await run(base_env(CRONHOOK_URL=sick, **local), "health")
            assert code == 1, err
            assert err.strip() == f"cronhook: {sick} answers 503: database unreachable"
            assert decoy.requests == []

            # The named server is healthy, the local one not: healthy.
            decoy.default = Reply(status=503)
            for ready in ([], ["--ready"]):
                code, _, err = await run(base_env(CRONHOOK_URL=server.url, **local), "health", *ready)
                assert code == 0, err
            assert decoy.requests == []

            # --server wins over CRONHOOK_URL; nothing listening is named too.
            code, _, err = await run(base_env(CRONHOOK_URL=server.url), "health", "--server", sick)
            assert code == 1 and sick in err
            nowhere = f"http://127.0.0.1:{free_port()}"
            code, _, err = await run(base_env(CRONHOOK_URL=nowhere), "health")
            assert code == 1 and err.startswith(f"cronhook: {nowhere} is not answering")
    finally:
        await decoy.stop()


# -- api-key verbs go through the named server's admin API -----------------------------------------


async def test_api_key_verbs_use_the_named_servers_admin_api(db_url: str, procs: Processes, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"  # a directory with no database in it (tmp_path holds the logs)
    elsewhere.mkdir()
    async with live_server(procs, db_url) as server, httpx.AsyncClient(base_url=server.url) as http:
        admin = base_env(CRONHOOK_URL=server.url, CRONHOOK_ADMIN_API_KEY=server.admin_key)
        # From a directory with no database in it: the key is made by the server.
        code, out, err = await run(admin, "api-key", "create", "--tenant", "acme", "--name", "ci", cwd=elsewhere)
        assert code == 0, err
        key = out.strip()
        assert (await http.get("/v1/targets", headers={"Authorization": f"Bearer {key}"})).status_code == 200
        assert list(elsewhere.iterdir()) == []

        code, out, err = await run(admin, "api-key", "list", "--tenant", "acme", cwd=elsewhere)
        assert code == 0, err
        (listed,) = [json.loads(line) for line in out.splitlines()]
        assert key.startswith(listed["key_prefix"]) and (listed["tenant"], listed["name"]) == ("acme", "ci")

        # --server names it as well as CRONHOOK_URL.
        by_flag = base_env(CRONHOOK_ADMIN_API_KEY=server.admin_key)
        code, out, err = await run(by_flag, "api-key", "revoke", listed["id"], "--server", server.url, cwd=elsewhere)
        assert code == 0, err
        assert json.loads(out)["revoked_at"] is not None
        assert (await http.get("/v1/targets", headers={"Authorization": f"Bearer {key}"})).status_code == 401

        # No admin key: one line saying which; a wrong one: the server's refusal, naming it.
        code, _, err = await run(base_env(CRONHOOK_URL=server.url), "api-key", "create", "--tenant", "acme")
        assert code == 2 and "CRONHOOK_ADMIN_API_KEY" in err and server.url in err
        wrong = base_env(CRONHOOK_URL=server.url, CRONHOOK_ADMIN_API_KEY="admin_" + "x" * 30)
        code, _, err = await run(wrong, "api-key", "create", "--tenant", "acme")
        assert code == 1 and err.startswith(f"cronhook: {server.url} answered 403 Forbidden"), err
        assert err.strip().endswith("(with the key from CRONHOOK_ADMIN_API_KEY)")
        nowhere = f"http://127.0.0.1:{free_port()}"
        code, _, err = await run({**admin, "CRONHOOK_URL": nowhere}, "api-key", "list", cwd=elsewhere)
        assert code == 3 and nowhere in err
    assert list(elsewhere.iterdir()) == []


# -- errors name the server, exit statuses say what happened --------------------------------------


async def test_errors_name_the_server_and_exit_with_the_documented_status(db_url: str, procs: Processes) -> None:
    async with live_server(procs, db_url) as server:
        code, _, err = await run(client_env(server), "jobs", "get", "00000000-0000-0000-0000-000000000000")
        assert code == 1 and err.startswith(f"cronhook: {server.url} answered 404 "), err

        # A key that is set but wrong: the server refused it, not "set CRONHOOK_API_KEY".
        wrong = base_env(CRONHOOK_URL=server.url, CRONHOOK_API_KEY="chk_test_" + "0" * 32)
        code, _, err = await run(wrong, "jobs", "list")
        assert code == 1 and err.startswith(f"cronhook: {server.url} answered 401"), err
        assert "refused the key from CRONHOOK_API_KEY" in err and "set CRONHOOK_API_KEY" not in err
        code, _, err = await run(base_env(CRONHOOK_URL=server.url), "jobs", "list")
        assert code == 1 and "no API key given: set CRONHOOK_API_KEY" in err

        nowhere = f"http://127.0.0.1:{free_port()}"
        code, _, err = await run(base_env(CRONHOOK_URL=nowhere, CRONHOOK_API_KEY=server.key), "targets", "list")
        assert code == 3 and err.startswith(f"cronhook: cannot reach {nowhere} "), err
        code, _, err = await run(client_env(server), "targets", "list", "--server", nowhere)
        assert code == 3 and nowhere in err

        # Usage: nothing is sent.
        assert (await run(client_env(server), "dead-letters", "replay"))[0] == 2
        assert (await run(client_env(server), "jobs", "update", "00000000-0000-0000-0000-000000000000"))[0] == 2
        assert (await run(client_env(server), "jobs", "list", "--limit", "0"))[0] == 2
        code, _, err = await run(client_env(server), "jobs", "create", "--target", "t", "--payload", "@/no/such/file")
        assert code == 2 and "cannot read /no/such/file" in err

        code, out, _ = await run(client_env(server), "jobs", "list", "--help")
        assert code == 0 and "3  the server did not answer" in out


# -- lists say when they are cut; a closed pipe is quiet --------------------------------------------


async def test_lists_say_when_they_are_cut_and_json_keeps_the_cursor(
    db_url: str, procs: Processes, receiver: Receiver
) -> None:
    async with live_server(procs, db_url) as server:
        target = await ok_json(server, "targets", "create", "--name", "t", "--url", receiver.url())
        made = [
            (await ok_json(server, "jobs", "create", "--target", target["id"], "--delay", "3600", "--name", f"j{i}"))
            for i in range(5)
        ]
        newest_first = [job["id"] for job in reversed(made)]

        code, out, err = await run(client_env(server), "jobs", "list", "--limit", "2")
        assert code == 0
        rows = out.splitlines()[2:]
        assert [row.split()[0] for row in rows] == newest_first[:2]
        assert err.startswith("cronhook: showing 2; more with --cursor ")
        cursor = err.split()[-1]

        page = await ok_json(server, "jobs", "list", "--limit", "2")
        assert [j["id"] for j in page["items"]] == newest_first[:2] and page["next_cursor"] == cursor
        code, out, err = await run(client_env(server), "jobs", "list", "--limit", "10", "--cursor", cursor)
        assert code == 0 and err == ""
        assert [row.split()[0] for row in out.splitlines()[2:]] == newest_first[2:]
        # Pages smaller than the limit: the cursor still goes on exactly after the last row.
        every = await ok_json(server, "jobs", "list", "--all")
        assert [j["id"] for j in every["items"]] == newest_first and every["next_cursor"] is None

        # Nobody reads stdout any more (`| head` has its line): exit 0, no traceback.
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:
            proc = await asyncio.create_subprocess_exec(
                CRONHOOK, "jobs", "list", "--all", env=client_env(server), stdout=write_end, stderr=subprocess.PIPE
            )
        finally:
            os.close(write_end)
        _, err_bytes = await asyncio.wait_for(proc.communicate(), CLI_TIMEOUT_S)
        assert (proc.returncode, err_bytes) == (0, b"")
        shell = await asyncio.create_subprocess_shell(
            f"{CRONHOOK} jobs list --all --json | head -n 1",
            env=client_env(server),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        out_bytes, err_bytes = await asyncio.wait_for(shell.communicate(), CLI_TIMEOUT_S)
        assert (shell.returncode, out_bytes, err_bytes) == (0, b"{\n", b"")


# -- runs newest first, the open async attempt first -----------------------------------------------


async def test_runs_are_newest_first_with_the_open_attempt_first_and_watch_follows_the_job(
    db_url: str, procs: Processes, receiver: Receiver
) -> None:
    # Two failed attempts, then a third the receiver accepts and reports on later.
    receiver.script = [Reply(status=500), Reply(status=500), Reply(status=202, body=b"")]
    async with live_server(procs, db_url) as server, httpx.AsyncClient(base_url=server.url) as http:
        target = await ok_json(
            server, "targets", "create", "--name", "t", "--url", receiver.url(), "--completion", "async"
        )
        made = await http.post(
            "/v1/jobs",
            headers=server.auth,
            json={"target_id": target["id"], "delay_s": 0.01, "backoff_base_s": 0.05, "backoff_max_s": 0.1},
        )
        job_id = made.json()["id"]

        async def awaiting() -> bool:
            return bool((await http.get(f"/v1/jobs/{job_id}", headers=server.auth)).json()["awaiting_completion"])

        await wait_for(awaiting, timeout=30, interval=0.2, message="the third attempt left open")

        async def pages(order: str | None) -> list[list[tuple[int, str]]]:
            found: list[list[tuple[int, str]]] = []
            cursor: str | None = None
            while True:
                params: dict[str, str | int] = {"limit": 1}
                if order is not None:
                    params["order"] = order
                if cursor is not None:
                    params["cursor"] = cursor
                page = (await http.get(f"/v1/jobs/{job_id}/runs", params=params, headers=server.auth)).json()
                found.append([(run["attempt"], run["outcome"]) for run in page["items"]])
                if (cursor := page["next_cursor"]) is None:
                    return found

        newest = [[(3, "awaiting_completion"), (2, "http_error")], [(1, "http_error")]]
        assert await pages(None) == await pages("desc") == newest
        assert await pages("asc") == [[(1, "http_error")], [(2, "http_error"), (3, "awaiting_completion")]]

        runs = await ok_json(server, "jobs", "runs", job_id)
        assert [r["attempt"] for r in runs["items"]] == [3, 2, 1] and runs["next_cursor"] is None
        oldest = await ok_json(server, "jobs", "runs", job_id, "--order", "asc")
        assert [r["attempt"] for r in oldest["items"]] == [1, 2, 3]
        code, out, err = await run(client_env(server), "jobs", "runs", job_id, "--limit", "1")
        shown = [line.split()[1:3] for line in out.splitlines()[2:]]
        # The open attempt comes on top of the one run asked for; the cursor goes on after that run.
        assert code == 0 and shown == [["3", "awaiting_completion"], ["2", "http_error"]]
        assert err.startswith("cronhook: showing 2; more with --cursor ")
        rest = await ok_json(server, "jobs", "runs", job_id, "--cursor", err.split()[-1])
        assert [r["attempt"] for r in rest["items"]] == [1] and rest["next_cursor"] is None

        # watch: a line per change, until the job finishes.
        watch = await asyncio.create_subprocess_exec(
            CRONHOOK, "jobs", "watch", job_id, "--interval", "0.1", env=client_env(server), stdout=subprocess.PIPE
        )
        assert watch.stdout is not None
        first = (await asyncio.wait_for(watch.stdout.readline(), CLI_TIMEOUT_S)).decode()
        assert "running" in first and "awaiting_completion" in first
        url = receiver.requests[-1].headers["cronhook-completion-url"]
        assert (await http.post(f"{url}/heartbeat", json={"progress": 50})).status_code == 204
        # The heartbeat's progress is a change of its own: wait for its line before completing,
        # or the two could fall within one poll.
        progress = (await asyncio.wait_for(watch.stdout.readline(), CLI_TIMEOUT_S)).decode()
        assert "50%" in progress, progress
        assert (await http.post(url, json={"outcome": "succeeded"})).status_code == 204
        rest_out, _ = await asyncio.wait_for(watch.communicate(), CLI_TIMEOUT_S)
        lines = rest_out.decode().splitlines()
        assert watch.returncode == 0
        assert lines and lines[-1].split()[1] == "succeeded", lines


# -- the verbs and options the API has --------------------------------------------------------------


async def test_the_missing_verbs_and_options(db_url: str, procs: Processes, receiver: Receiver, tmp_path: Path) -> None:
    receiver.by_path["/gone"] = Reply(status=410)
    async with live_server(procs, db_url) as server:
        target = await ok_json(server, "targets", "create", "--name", "t", "--url", receiver.url())
        shown = await ok_json(server, "targets", "get", target["id"])
        assert (shown["name"], shown["url"]) == ("t", receiver.url())
        changed = await ok_json(server, "targets", "update", target["id"], "--name", "renamed", "--rate", "5")
        assert (changed["name"], changed["rate_per_s"]) == ("renamed", 5)
        rotated = await ok_json(server, "targets", "rotate-secret", target["id"], "--grace", "0")
        assert rotated["secret"].startswith("whsec_") and rotated["secret"] != target["secret"]

        payload_file = tmp_path / "payload.json"
        payload_file.write_text('{"from": "file"}')
        job = await ok_json(
            server, "jobs", "create", "--target", target["id"], "--every", "3600", "--payload", f"@{payload_file}",
            "--start-at", "2030-01-01T00:00:00Z", "--end-at", "2031-01-01T00:00:00Z", "--max-runs", "3",
            "--overlap", "allow", "--misfire", "skip",
        )  # fmt: skip
        assert job["payload"] == {"from": "file"}
        assert (job["every_s"], job["max_runs"], job["overlap_policy"], job["misfire_policy"]) == (
            3600, 3, "allow", "skip",
        )  # fmt: skip
        assert job["next_run_at"].startswith("2030-01-01")
        updated = await ok_json(
            server, "jobs", "update", job["id"], "--payload", "-", "--name", "nightly", stdin=b'{"from": "stdin"}'
        )
        assert (updated["payload"], updated["name"], updated["every_s"]) == ({"from": "stdin"}, "nightly", 3600)

        gone = await ok_json(server, "targets", "create", "--name", "gone", "--url", receiver.url("/gone"))
        doomed = await ok_json(server, "jobs", "create", "--target", gone["id"], "--max-attempts", "1")

        async def dead_letters() -> list[Any]:
            found: list[Any] = (await ok_json(server, "dead-letters", "list", "--job", doomed["id"]))["items"]
            return found

        await wait_for(dead_letters, timeout=30, interval=0.3, message="a dead letter")
        (letter,) = await dead_letters()
        detail = await ok_json(server, "dead-letters", "get", letter["id"])
        assert detail["job_id"] == doomed["id"] and [r["status_code"] for r in detail["runs"]] == [410]
        assert "last_status_code  410" in await ok(server, "dead-letters", "get", letter["id"])
        await ok(server, "dead-letters", "delete", letter["id"])
        assert await dead_letters() == []
        code, _, err = await run(client_env(server), "dead-letters", "get", letter["id"])
        assert code == 1 and "404" in err

        await ok(server, "jobs", "cancel", job["id"])
        audit = await ok_json(server, "audit", "list", "--limit", "200")
        actions = [entry["action"] for entry in audit["items"]]
        assert actions[0] == "cancelJob" and "updateTarget" in actions and "rotateTargetSecret" in actions
        assert "updateJob" in actions and "deleteDeadLetter" in actions
        table = await ok(server, "audit", "list", "--limit", "1")
        assert table.splitlines()[0].split() == ["id", "created_at", "actor", "api_key_id", "action", "object_id",
                                                 "request_id"]  # fmt: skip

        spare = await ok_json(server, "targets", "create", "--name", "spare", "--url", receiver.url())
        deleted = await ok_json(server, "targets", "delete", spare["id"])
        assert deleted == {"id": spare["id"], "deleted": "target"}
        code, _, err = await run(client_env(server), "targets", "get", spare["id"])
        assert code == 1 and "404" in err
