"""cronhook as real processes for the benches: one command line (`Service`) or a group of named
ones sharing a bootstrap API key (`Services`), each in a process group of its own, waited on
until it answers /healthz and stopped by pid (SIGTERM, then SIGKILL to the group), so children
it starts cannot outlive a bench; their CPU and memory; and the key ring they all get.

Benches import this through harness.py.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import psutil

from app.keyring import new_key_entry

BIN = Path(sys.executable).parent
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 20.0

# One key ring per run for secrets at rest (app/keyring.py), handed to every cronhook process
# a bench starts (CRONHOOK_SECRET_KEYS): they open what the bench sealed with it
# (harness.BENCH_KEY_RING).
BENCH_SECRET_KEYS = new_key_entry("bench")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop_process(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """`sig`, then SIGKILL if it is still there after `timeout_s`; reaped either way."""
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def _process_tree(pid: int) -> list[psutil.Process]:
    """A process and its live descendants (none when it is gone)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def tree_cpu_by_process(pid: int) -> dict[str, float]:
    """CPU seconds of a process and each live descendant, keyed by `pid command...` (the
    command line's last three words: the role). Unlike tree_cpu_s, children already reaped
    are not counted: the parts add up to it while no child exits."""
    cpu: dict[str, float] = {}
    for proc in _process_tree(pid):
        try:
            t = proc.cpu_times()
            words = proc.cmdline()
        except psutil.NoSuchProcess:
            continue
        cpu[f"{proc.pid} {' '.join(Path(w).name for w in words[-3:])}"] = t.user + t.system
    return cpu


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process, its live descendants and the children it has reaped."""
    total = 0.0
    for proc in _process_tree(pid):
        try:
            t = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def wait_until_quiet(
    cpu_s: Callable[[], float], busy_below: float = 0.15, window_s: float = 0.5, deadline_s: float = 60.0
) -> float:
    """Waits until a process tree uses less than `busy_below` of a core over `window_s` (its
    children done starting: `cronhook up` starts scheduler processes after the API answers),
    at most `deadline_s`; returns the seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < deadline_s:
        before = cpu_s()
        time.sleep(window_s)
        if cpu_s() - before < busy_below * window_s:
            break
    return time.monotonic() - started


def new_api_key() -> str:
    return "chk_bench_" + secrets.token_urlsafe(16)


class Service:
    """One `cronhook` command line on a database, in a process group of its own. An API role
    gets a free port and a bootstrap API key; a scheduler or reaper role a free probe port
    (CRONHOOK_METRICS_PORT). start() waits until it answers /healthz there."""

    def __init__(
        self,
        cmd: str,
        database_url: str,
        log_path: Path,
        extra_env: Mapping[str, str] | None = None,
        replica_id: str | None = None,
        api_key: str | None = None,
    ) -> None:
        self.argv = shlex.split(cmd)
        if self.argv and self.argv[0] == "cronhook":
            self.argv[0] = str(BIN / "cronhook")  # this venv's, whatever PATH says
        self.port = free_port()
        self.api_key = api_key or new_api_key()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.serves_http = any(role in self.argv for role in ("up", "api"))
        self.log_path = log_path
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("CRONHOOK_")}
        self.env.update(
            CRONHOOK_DATABASE_URL=database_url,
            CRONHOOK_HOST="127.0.0.1",
            CRONHOOK_PORT=str(self.port),
            CRONHOOK_BOOTSTRAP_API_KEY=self.api_key,
            CRONHOOK_LOG_LEVEL="WARNING",
            CRONHOOK_DATA_DIR=str(log_path.parent / "cronhook-data"),
            # The benches' receivers listen on 127.0.0.1, which the egress policy refuses by default.
            CRONHOOK_EGRESS_ALLOW="127.0.0.0/8",
            # Benches measure throughput: no per-tenant request rate or job-count quota.
            CRONHOOK_TENANT_REQUESTS_PER_S="0",
            CRONHOOK_TENANT_MAX_ACTIVE_JOBS="100000000",
            CRONHOOK_SECRET_KEYS=BENCH_SECRET_KEYS,
        )
        if not self.serves_http:
            self.env["CRONHOOK_METRICS_PORT"] = str(free_port())
        if replica_id is not None:
            self.env["CRONHOOK_REPLICA_ID"] = replica_id
        self.env.update(extra_env or {})
        self.probe_base = self.base_url if self.serves_http else f"http://127.0.0.1:{self.env['CRONHOOK_METRICS_PORT']}"
        self.proc: subprocess.Popen[bytes] | None = None
        self._terminated = False

    def start(self, wait: bool = True, timeout_s: float = START_TIMEOUT_S) -> None:
        self._terminated = False
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        if wait:
            self.wait_ready(timeout_s)

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Until /healthz answers 200 (the process is up; /readyz would also want the database)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                with urllib.request.urlopen(self.probe_base + "/healthz", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{' '.join(self.argv)} did not answer /healthz within {timeout_s:g} s")

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            tail = self.log_path.read_text(errors="replace")[-1500:]
            raise RuntimeError(f"{' '.join(self.argv)} exited with code {self.proc.returncode}; its log ends:\n{tail}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def cpu_s(self) -> float:
        return tree_cpu_s(self.pid) if self.proc is not None and self.proc.poll() is None else 0.0

    def rss_bytes(self) -> int:
        """Resident memory of the process and its live descendants."""
        total = 0
        for proc in _process_tree(self.pid):
            try:
                total += proc.memory_info().rss
            except psutil.NoSuchProcess:
                continue
        return total

    def terminate(self) -> None:
        """SIGTERM, once: a graceful stop begins (stop() waits for it)."""
        if self.proc is not None and self.proc.poll() is None and not self._terminated:
            self.proc.send_signal(signal.SIGTERM)
            self._terminated = True

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> float:
        """SIGTERM (a graceful stop), then SIGKILL to the whole process group; the seconds the
        graceful stop took."""
        started = time.monotonic()
        self.terminate()
        proc, self.proc = self.proc, None
        if proc is None:
            return 0.0
        if proc.poll() is None:
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                pass
        took = time.monotonic() - started
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # stragglers of the group (worker processes)
        except ProcessLookupError:
            pass
        stop_process(proc, signal.SIGKILL, 10)
        return took

    def kill(self) -> None:
        """SIGKILL to the process group: a crash, no graceful stop."""
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)

    def api(self, method: str, path: str, body: Any = None, timeout_s: float = 60) -> tuple[int, Any]:
        """One request with the bootstrap key: (status, decoded JSON body or None)."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base_url + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.api_key}")
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, None

    def create_target(self, url: str, timeout_s: float | None = None) -> uuid.UUID:
        fields: dict[str, Any] = {"name": "bench-receiver", "url": url}
        if timeout_s is not None:
            fields["timeout_s"] = timeout_s
        status, body = self.api("POST", "/v1/targets", fields)
        if status != 201:
            raise RuntimeError(f"POST /v1/targets answered {status}: {body}")
        return uuid.UUID(body["id"])


class Services:
    """The named cronhook processes of one run (scheduler replicas, a reaper), each a Service
    logging to `<log_dir>/<name>.log`, sharing a database, extra environment and the bootstrap
    API key (each process that starts makes sure the key it was given is the bootstrap one)."""

    def __init__(self, database_url: str, log_dir: Path, env: Mapping[str, str] | None = None) -> None:
        self._database_url = database_url
        self._log_dir = log_dir
        self._env = dict(env or {})
        self._api_key = new_api_key()
        self.by_name: dict[str, Service] = {}

    def start(self, name: str, cmd: str, wait: bool = True, replica_id: str | None = None) -> Service:
        log_path = self._log_dir / f"{name}.log"
        service = Service(cmd, self._database_url, log_path, self._env, replica_id, self._api_key)
        self.by_name[name] = service
        service.start(wait)
        return service

    def wait_ready(self) -> None:
        for service in self.by_name.values():
            if service.proc is not None:
                service.wait_ready()

    def check_alive(self) -> None:
        """Raises when a process the run did not stop or kill has exited."""
        for service in self.by_name.values():
            service.check_alive()

    def kill(self, name: str) -> None:
        service = self.by_name.pop(name)
        service.kill()

    def stop(self, name: str) -> float:
        return self.by_name.pop(name).stop()

    def stop_all(self) -> None:
        """Every process at once: SIGTERM to all, then each waited for (SIGKILL if it hangs)."""
        for service in self.by_name.values():
            service.terminate()
        for service in self.by_name.values():
            service.stop()

    def rss_mb(self) -> dict[str, float]:
        return {name: round(s.rss_bytes() / 2**20, 1) for name, s in self.by_name.items() if s.proc is not None}
