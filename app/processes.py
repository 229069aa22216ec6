"""Child processes of one `cronhook` command: the scheduler processes of `up` and `scheduler`
(`--processes N`) and the extra API workers of `up` and `api` (`--workers N`).

The parent owns the database runtime (it starts the embedded PostgreSQL, migrates and writes
the bootstrap key before any child starts); each child attaches to the same server with
migrations off. Children never outlive the parent:

- SIGTERM/SIGINT to the parent stops it gracefully, which sends SIGTERM to every child and
  waits for them (each lets its deliveries in flight finish); a child that exits non-zero, or
  on its own while the parent runs, makes the parent stop the others and exit 1. A stop
  signal to the whole process group (a terminal's Ctrl-C, systemd's stop) reaches every child
  at once: each stops cleanly on its own, which is no failure then.
- If the parent dies without stopping them (SIGKILL, OOM), each child is sent SIGTERM by the
  kernel (Linux `PR_SET_PDEATHSIG`, set by the child itself, then checked against the parent
  it expected, so a parent that died during the child's start-up is noticed) and, on every
  platform, sees end-of-file on a pipe whose only write end the parent held.

Children are spawned from the parent's main thread: PR_SET_PDEATHSIG fires when the thread
that forked the child ends, not the process.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from app import early_stop
from app.logs import log_event
from app.metrics import process_exited
from app.settings import Settings

logger = logging.getLogger(__name__)

# Internal: set by the parent for its children only (not settings, hence no CRONHOOK_ prefix).
PARENT_PID_ENV = "_CRONHOOK_PARENT_PID"
PARENT_PIPE_ENV = "_CRONHOOK_PARENT_PIPE_FD"
LISTEN_FD_ENV = "_CRONHOOK_LISTEN_FD"

_PR_SET_PDEATHSIG = 1
# After SIGTERM, a child gets the longest delivery deadline plus this to stop before SIGKILL.
STOP_MARGIN_S = 10.0
# How long a child that exited 0 gives this process's own stop to arrive before it counts as
# one that left on its own. A stop sent to the whole group (a terminal's Ctrl-C, systemd's
# stop) reaches parent and children at the same moment, but the parent acts on it only when
# its event loop next turns (loop.add_signal_handler), which a busy loop can put off until
# after a child's quick exit.
GROUP_STOP_WAIT_S = 1.0


@dataclass(frozen=True)
class ChildSpec:
    name: str
    args: list[str]  # the `cronhook` arguments, e.g. ["scheduler"]
    env: dict[str, str] = field(default_factory=dict)
    pass_fds: tuple[int, ...] = ()


def scheduler_children(settings: Settings) -> list[ChildSpec]:
    """`--processes N` above 1: N scheduler processes, each a replica of its own."""
    count = settings.scheduler_processes
    if count <= 1:
        return []
    return [ChildSpec(f"scheduler-{i}", ["scheduler"], child_env(dict(os.environ), i)) for i in range(1, count + 1)]


def child_env(base: dict[str, str], index: int) -> dict[str, str]:
    """The environment of child `index` (1-based): one process per child, no migrations or
    bootstrap key (the parent did both), and its own replica id."""
    env = {k: v for k, v in base.items() if k not in ("CRONHOOK_BOOTSTRAP_API_KEY", "CRONHOOK_BOOTSTRAP_API_KEY_FILE")}
    # The parent serves the probes and the metrics of all (PROMETHEUS_MULTIPROC_DIR): a child
    # binding the same port would fail.
    env.update(
        CRONHOOK_SCHEDULER_PROCESSES="1",
        CRONHOOK_API_WORKERS="1",
        CRONHOOK_AUTO_MIGRATE="false",
        CRONHOOK_METRICS_PORT="0",
    )
    replica_id = base.get("CRONHOOK_REPLICA_ID")
    if replica_id:
        env["CRONHOOK_REPLICA_ID"] = f"{replica_id}-{index}"
    # else: each child makes its own (host, pid, random), app/settings.py default_replica_id
    return env


class Children:
    """The running children of this process."""

    def __init__(self) -> None:
        # The parent keeps the write end (non-inheritable) and never writes: the children
        # read end-of-file when the last copy closes, i.e. when the parent is gone.
        self._read_fd, self._write_fd = os.pipe()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.stopping = False

    def spawn(self, spec: ChildSpec) -> subprocess.Popen[bytes]:
        assert threading.current_thread() is threading.main_thread(), "PR_SET_PDEATHSIG follows the forking thread"
        env = {**spec.env, PARENT_PID_ENV: str(os.getpid()), PARENT_PIPE_ENV: str(self._read_fd)}
        # The child starts with SIGTERM and SIGINT blocked (the mask survives exec) and
        # unblocks them once its handler is in place (app/entry.py): a stop that comes while
        # it is starting (the parent's SIGTERM, a terminal's Ctrl-C to the whole group) waits
        # those few milliseconds and ends it cleanly, instead of killing it.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, early_stop.STOP_SIGNALS)
        try:
            # -P: the working directory is not put first on sys.path, so a project's own `app`
            # package where cronhook was started cannot stand in for cronhook's.
            proc = subprocess.Popen(
                [sys.executable, "-P", "-m", "app", *spec.args], env=env, pass_fds=(self._read_fd, *spec.pass_fds)
            )
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        self.procs[spec.name] = proc
        log_event(logger, "child_started", child=spec.name, pid=proc.pid)
        return proc

    def exited(self) -> tuple[str, int] | None:
        """A child that has exited (name, exit code), if any."""
        for name, proc in self.procs.items():
            code = proc.poll()
            if code is not None:
                return name, code
        return None

    async def wait_until(self, stop: asyncio.Event, interval_s: float = 0.2) -> tuple[str, int] | None:
        """Returns when this process is told to stop (None): `stop` set, or a stop signal taken
        (app/early_stop.py), which can come before `stop` is set, and which a Ctrl-C or
        systemd's stop sends every child at the same moment; or when a child exits first,
        on its own (its name and code)."""
        while not _told_to_stop(stop):
            if (gone := self.exited()) is not None:
                # Exit 0 is a child's answer to a stop signal: a group stop, when this
                # process's own comes too (GROUP_STOP_WAIT_S).
                if gone[1] == 0 and await _told_to_stop_within(stop, GROUP_STOP_WAIT_S):
                    return None
                return gone
            await _until_set(stop, interval_s)
        return None

    def stop(self, grace_s: float) -> dict[str, int]:
        """SIGTERM to every child, then waits (SIGKILL after `grace_s` + STOP_MARGIN_S); returns
        each child's exit code. Blocking: call it in a thread from async code."""
        self.stopping = True
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s + STOP_MARGIN_S
        codes: dict[str, int] = {}
        for name, proc in self.procs.items():
            try:
                codes[name] = proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log_event(logger, "child_killed", logging.WARNING, child=name, pid=proc.pid)
                proc.kill()
                codes[name] = proc.wait()
        for proc in self.procs.values():
            process_exited(proc.pid)  # its live gauges leave the shared metrics
        for name, code in codes.items():
            level = logging.INFO if code == 0 else logging.ERROR
            log_event(logger, "child_stopped", level, child=name, exit_code=code)
        os.close(self._read_fd)
        os.close(self._write_fd)
        return codes


def attach_to_parent() -> None:
    """In a child (no-op otherwise): stop with SIGTERM when the parent goes."""
    parent = os.environ.pop(PARENT_PID_ENV, None)
    pipe_fd = os.environ.pop(PARENT_PIPE_ENV, None)
    if parent is None:
        return
    _set_parent_death_signal(signal.SIGTERM)
    if os.getppid() != int(parent):  # the parent died before the line above
        raise SystemExit(0)
    if pipe_fd is not None:
        threading.Thread(target=_watch_pipe, args=(int(pipe_fd),), name="parent-watchdog", daemon=True).start()


def _set_parent_death_signal(sig: int) -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):  # no prctl: the pipe watchdog still applies
        pass


def _watch_pipe(fd: int) -> None:
    while os.read(fd, 1):
        pass
    log_event(logger, "parent_gone", logging.WARNING, pid=os.getpid())
    os.kill(os.getpid(), signal.SIGTERM)


def _told_to_stop(stop: asyncio.Event) -> bool:
    return stop.is_set() or early_stop.requested()


async def _until_set(stop: asyncio.Event, at_most_s: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), at_most_s)
    except TimeoutError:
        pass


async def _told_to_stop_within(stop: asyncio.Event, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while not _told_to_stop(stop) and time.monotonic() < deadline:
        # early_stop's record comes from a signal handler without setting `stop`: polled.
        await _until_set(stop, 0.02)
    return _told_to_stop(stop)


def failed(codes: dict[str, int], gone: tuple[str, int] | None) -> bool:
    """A run failed if a child left on its own or any child exited non-zero once told to
    stop. (A child still starting when SIGTERM came has no handler yet and dies of it.)"""
    return gone is not None or any(code not in (0, -signal.SIGTERM) for code in codes.values())


class Supervisor:
    """Children of a running service: started, watched until `stop` is set or one of them
    exits on its own, then stopped. `failed` afterwards says whether the run failed."""

    def __init__(self, specs: list[ChildSpec], grace_s: float) -> None:
        self.specs = specs
        self.grace_s = grace_s
        self.children = Children()
        self.gone: tuple[str, int] | None = None
        self.codes: dict[str, int] = {}

    def start(self) -> None:
        for spec in self.specs:
            self.children.spawn(spec)

    async def watch(self, stop: asyncio.Event) -> tuple[str, int] | None:
        self.gone = await self.children.wait_until(stop)
        if self.gone is not None:
            name, code = self.gone
            log_event(logger, "child_exited", logging.ERROR, child=name, exit_code=code)
        return self.gone

    async def stop(self) -> None:
        self.codes = await asyncio.to_thread(self.children.stop, self.grace_s)

    @property
    def failed(self) -> bool:
        return failed(self.codes, self.gone)
