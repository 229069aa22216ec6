"""What a person sees on a first `cronhook up`: readable lines on a terminal, JSON lines
otherwise, and each start-up notice once, though `--processes 2` starts three processes."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import re
import secrets
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.test_processes import CRONHOOK, STOP_TIMEOUT_S, base_env, free_port, wait_until_ready
from tests.receiver import wait_for

pytestmark = pytest.mark.e2e

# TextFormatter's lines (app/logs.py): `12:00:01.234 WARNING egress_internal_allowed allowed=...`.
TEXT_LINE = re.compile(r"^\d\d:\d\d:\d\d\.\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) +\S")
ONCE_PER_COMMAND = ("egress_internal_allowed", "embedded_postgres_started")


class _Output:
    """Everything a process writes to one descriptor, read on a thread as it comes (a pty or a
    pipe left unread would block the writer)."""

    def __init__(self, fd: int) -> None:
        self.chunks: list[bytes] = []
        self._fd = fd
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self._fd, 65536)
            except OSError:  # EIO: a pty's last writer closed it
                return
            if not chunk:
                return
            self.chunks.append(chunk)

    def text(self) -> str:
        return b"".join(self.chunks).decode(errors="replace")

    def lines(self, timeout: float = 10.0) -> list[str]:
        """The lines written until the last writer closed (or `timeout`), without the carriage returns a pty adds."""
        self._thread.join(timeout)
        return [line.rstrip("\r") for line in self.text().split("\n") if line.strip()]


@contextlib.contextmanager
def _data_dir() -> Iterator[Path]:
    path = Path(f"/tmp/chf{secrets.token_hex(3)}")  # short: the socket path must stay small
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def _first_run(data_dir: Path, terminal: bool) -> list[str]:
    """Starts `cronhook up --processes 2` on a fresh data dir, with its output on a terminal or
    a pipe, waits until it is ready, stops it with SIGTERM and returns the lines it wrote."""
    port = free_port()
    # Loopback allowed on purpose: the start-up warning every process would otherwise repeat.
    env = base_env(CRONHOOK_DATA_DIR=str(data_dir), CRONHOOK_EGRESS_ALLOW="127.0.0.1")
    args = [CRONHOOK, "up", "--port", str(port), "--processes", "2"]
    if terminal:
        reader_fd, writer_fd = pty.openpty()
    else:
        reader_fd, writer_fd = os.pipe()
    try:
        proc = subprocess.Popen(args, env=env, stdin=subprocess.DEVNULL, stdout=writer_fd, stderr=writer_fd)
    finally:
        os.close(writer_fd)  # the process and its children hold the only write ends
    output = _Output(reader_fd)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            await wait_until_ready(http, timeout=120)
        # Ready is the parent's word: the children may still be starting (and logging).
        await wait_for(
            lambda: len(_events(output.text().splitlines(), "scheduler_started")) == 2,
            timeout=60,
            message="both scheduler processes started",
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=STOP_TIMEOUT_S) == 0, "\n".join(output.lines()[-40:])
        return output.lines()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        output.lines(timeout=5)
        os.close(reader_fd)


def _events(lines: list[str], event: str) -> list[str]:
    return [line for line in lines if re.search(rf"(^|[ \"]){event}([ \"]|$)", line)]


async def test_a_terminal_gets_readable_lines_and_each_start_up_notice_once() -> None:
    with _data_dir() as data_dir:
        lines = await _first_run(data_dir, terminal=True)
    unreadable = [line for line in lines if not TEXT_LINE.match(line)]
    assert not unreadable, unreadable[:5]
    for event in ONCE_PER_COMMAND:
        assert len(_events(lines, event)) == 1, (event, _events(lines, event))
    # The children did start (and so had their chance to repeat the parent).
    assert len(_events(lines, "scheduler_started")) == 2, lines


async def test_a_pipe_gets_json_lines_and_each_start_up_notice_once() -> None:
    with _data_dir() as data_dir:
        lines = await _first_run(data_dir, terminal=False)
    entries = [json.loads(line) for line in lines]  # every line is one JSON object
    events = [entry["event"] for entry in entries]
    for event in ONCE_PER_COMMAND:
        assert events.count(event) == 1, (event, events)
    (warning,) = [entry for entry in entries if entry["event"] == "egress_internal_allowed"]
    assert (warning["level"], warning["allowed"]) == ("warning", "127.0.0.1/32")
    assert events.count("scheduler_started") == 2, events
