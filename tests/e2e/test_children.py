"""`--processes` and `--workers`: real child processes, real signals. SIGTERM to the parent
stops every child cleanly (exit 0); SIGKILL of the parent leaves no child behind; with the
embedded PostgreSQL the parent owns the server, which stops with it."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import httpx
import psutil
import pytest

from tests.e2e.test_processes import CRONHOOK, base_env, free_port, wait_until_ready
from tests.receiver import wait_for


def events(log: Path, name: str) -> list[dict[str, object]]:
    found = []
    for line in log.read_text(errors="replace").splitlines():
        if f'"{name}"' in line:
            try:
                found.append(json.loads(line))
            except ValueError:
                continue
    return found


def tail(log: Path, lines: int = 60) -> str:
    """The log's last lines, for a failure's message: which child failed, and how."""
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def reap(parent: subprocess.Popen[bytes]) -> None:
    """Kills and reaps `parent` if it still runs: in a `finally`, even when the test failed."""
    if parent.poll() is None:
        parent.kill()
        parent.wait(timeout=10)


def child_pids(log: Path) -> list[int]:
    return [int(str(e["pid"])) for e in events(log, "child_started")]


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def start(
    args: list[str], env: dict[str, str], log: Path, cwd: Path | None = None, own_group: bool = False
) -> subprocess.Popen[bytes]:
    """`own_group`: in a process group of its own, as a terminal's foreground job is, so a
    Ctrl-C (os.killpg) reaches the parent and its children, and nothing else."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [CRONHOOK, *args], env=env, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, start_new_session=own_group
        )


def project_with_its_own_app_package(tmp_path: Path) -> Path:
    """A directory like many a FastAPI project's: its own `app` package, which exits 3."""
    project = tmp_path / "project"
    (project / "app").mkdir(parents=True)
    (project / "app" / "__init__.py").write_text("raise SystemExit(3)\n")
    (project / "app" / "__main__.py").write_text("raise SystemExit(3)\n")
    return project


async def test_sigterm_stops_every_scheduler_process_with_exit_0(db_url: str, tmp_path: Path) -> None:
    log = tmp_path / "scheduler.log"
    env = base_env(CRONHOOK_DATABASE_URL=db_url, CRONHOOK_REPLICA_ID="multi")
    # Started where a project's own `app` package is: the children are cronhook's still.
    parent = start(["scheduler", "--processes", "2"], env, log, cwd=project_with_its_own_app_package(tmp_path))
    try:
        # Both children are replicas of their own, named after the parent's replica id.
        await wait_for(lambda: len(events(log, "scheduler_started")) == 2, timeout=60, message="two schedulers")
        assert sorted(str(e["replica_id"]) for e in events(log, "scheduler_started")) == ["multi-1", "multi-2"]
        children = child_pids(log)
        assert len(children) == 2 and all(alive(pid) for pid in children)
        parent.send_signal(signal.SIGTERM)
        assert parent.wait(timeout=60) == 0, tail(log)
    finally:
        reap(parent)
    assert not any(alive(pid) for pid in children)
    assert sorted((e["child"], e["exit_code"]) for e in events(log, "child_stopped")) == [
        ("scheduler-1", 0),
        ("scheduler-2", 0),
    ]
    assert len(events(log, "scheduler_stopped")) == 2  # each stopped gracefully


async def test_sigkill_of_the_parent_leaves_no_child(db_url: str, tmp_path: Path) -> None:
    log = tmp_path / "up.log"
    port = free_port()
    env = base_env(CRONHOOK_DATABASE_URL=db_url)
    parent = start(["up", "--port", str(port), "--processes", "2", "--workers", "2"], env, log)
    children: list[int] = []
    try:
        await wait_for(lambda: len(child_pids(log)) == 3, timeout=60, message="three children")
        children = child_pids(log)
        await wait_for(lambda: len(events(log, "scheduler_started")) == 2, timeout=60, message="schedulers up")
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        await wait_for(lambda: not any(alive(pid) for pid in children), timeout=60, message="children gone")
    finally:
        for pid in children:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        if parent.poll() is None:
            parent.kill()
        parent.wait(timeout=10)


async def test_up_with_processes_and_workers_on_embedded_postgres(tmp_path: Path) -> None:
    data_dir = Path(f"/tmp/chc{os.getpid()}")  # short: the socket path must stay small
    log = tmp_path / "up.log"
    port = free_port()
    key = "chk_e2e_children_bootstrap_key"
    # The port from the environment, as in production: the API workers inherit it along with
    # the listening socket, and must not take the socket's own port for a clash.
    env = base_env(CRONHOOK_DATA_DIR=str(data_dir), CRONHOOK_BOOTSTRAP_API_KEY=key, CRONHOOK_PORT=str(port))
    parent = start(["up", "--processes", "2", "--workers", "2"], env, log)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            await wait_until_ready(http, timeout=90)
            await wait_for(lambda: len(events(log, "scheduler_started")) == 2, timeout=60, message="schedulers up")
            auth = {"Authorization": f"Bearer {key}"}
            # Requests land on either API process; every one is served.
            for _ in range(6):
                response = await http.post(
                    "/v1/targets", json={"name": "t", "url": "http://127.0.0.1:9/h"}, headers=auth
                )
                assert response.status_code == 201, response.text
            assert not events(log, "child_exited"), "a child process died"
        postmaster = data_dir / "pg" / "postmaster.pid"
        assert postmaster.exists()
        # Only the parent migrated.
        assert len(events(log, "schema_migrated")) == 1
        children = child_pids(log)
        parent.send_signal(signal.SIGTERM)
        assert parent.wait(timeout=60) == 0, tail(log)
        assert not any(alive(pid) for pid in children)
        assert {e["exit_code"] for e in events(log, "child_stopped")} == {0}
        await wait_for(lambda: not postmaster.exists(), timeout=20, message="embedded server stopped")
        assert not re.search(key, log.read_text())
    finally:
        reap(parent)
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.mark.parametrize("ctrl_c", [False, True], ids=["sigterm-to-the-parent", "ctrl-c-to-the-group"])
async def test_a_stop_while_the_children_are_starting_stops_them_with_exit_0(
    db_url: str, tmp_path: Path, ctrl_c: bool
) -> None:
    log = tmp_path / "scheduler.log"
    env = base_env(CRONHOOK_DATABASE_URL=db_url)
    parent = start(["scheduler", "--processes", "2"], env, log, own_group=ctrl_c)
    try:
        # The stop comes as soon as the children exist: they are still starting (interpreter,
        # imports), long before their schedulers run.
        await wait_for(lambda: len(child_pids(log)) == 2, timeout=60, interval=0.01, message="two children")
        children = child_pids(log)
        if ctrl_c:  # a terminal's: SIGINT to the whole group, the children still importing
            os.killpg(parent.pid, signal.SIGINT)
        else:
            parent.send_signal(signal.SIGTERM)
        assert parent.wait(timeout=60) == 0, tail(log)
    finally:
        reap(parent)
    assert not any(alive(pid) for pid in children)
    assert sorted((e["child"], e["exit_code"]) for e in events(log, "child_stopped")) == [
        ("scheduler-1", 0),
        ("scheduler-2", 0),
    ]
    # Structured logs to the end: a stop during start-up prints nothing that is not an event
    # (such as Python's "coroutine ... was never awaited", or a KeyboardInterrupt's traceback).
    assert all(json.loads(line) for line in log.read_text().splitlines() if line.strip())


async def test_ctrl_c_on_a_running_up_stops_every_process_with_exit_0(db_url: str, tmp_path: Path) -> None:
    # The signal reaches the children at the same moment as the parent (as systemd's stop
    # does too): each stops cleanly on its own, while the parent is still closing its server.
    # That is a stop, not a child that left on its own.
    log = tmp_path / "up.log"
    port = free_port()
    env = base_env(CRONHOOK_DATABASE_URL=db_url, CRONHOOK_PORT=str(port))
    parent = start(["up", "--processes", "2", "--workers", "2"], env, log, own_group=True)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            await wait_until_ready(http, timeout=90)
        await wait_for(lambda: len(events(log, "scheduler_started")) == 2, timeout=60, message="schedulers up")
        await wait_for(lambda: len(events(log, "Application startup complete.")) == 2, timeout=60, message="workers")
        children = child_pids(log)
        os.killpg(parent.pid, signal.SIGINT)
        assert parent.wait(timeout=60) == 0, tail(log)
    finally:
        reap(parent)
    assert not any(alive(pid) for pid in children)
    assert not events(log, "child_exited")
    assert sorted((e["child"], e["exit_code"]) for e in events(log, "child_stopped")) == [
        ("api-2", 0),
        ("scheduler-1", 0),
        ("scheduler-2", 0),
    ]
