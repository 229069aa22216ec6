"""Serving the API (`cronhook up` and `cronhook api`): uvicorn on this process's socket, and
with `--workers N` the API processes sharing it. Only these roles import the API stack
(FastAPI, the routes, uvicorn): a scheduler or reaper process never loads it."""

from __future__ import annotations

import os
import signal
import socket
import sys
from types import FrameType

import uvicorn

from app import early_stop, event_loop
from app.api.app import create_app
from app.processes import LISTEN_FD_ENV, ChildSpec, Supervisor, child_env, scheduler_children
from app.runtime import DatabaseUnusable, check_database, warn_if_egress_opened
from app.services.probes import ensure_port_free
from app.settings import Settings


class _Server(uvicorn.Server):
    """Exits normally after a graceful stop on SIGTERM/SIGINT. (uvicorn raises the signal
    again once stopped, which makes the exit code -15 and skips atexit.)"""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        early_stop.record()
        super().handle_exit(sig, frame)
        self._captured_signals.clear()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if early_stop.requested():
            # The SIGTERM came while the loop started, before uvicorn's handler was in place.
            self.handle_exit(signal.SIGTERM, None)


def serve(settings: Settings, run_services: bool) -> None:
    """`api` and `up`: this process serves the API (and for `up` runs the reaper, and the
    scheduler unless it has processes of its own); `--workers` adds API processes on the
    same listening socket, `--processes` scheduler processes."""
    inherited = os.environ.pop(LISTEN_FD_ENV, None)
    early_stop.exit_if_requested()  # a SIGTERM during the imports: nothing to start
    if inherited is None:
        # A worker of `--workers` serves its parent's socket: the port is taken, by design.
        ensure_port_free(settings.host, settings.port, "--port or CRONHOOK_PORT")
        try:
            event_loop.run(check_database(settings))
        except DatabaseUnusable as exc:
            print(f"cronhook: {exc}", file=sys.stderr)  # noqa: T201
            raise SystemExit(2) from None
    warn_if_egress_opened(settings)
    sockets: list[socket.socket] | None = None
    children = scheduler_children(settings) if run_services else []
    if inherited is not None:
        sockets = [socket.socket(fileno=int(inherited))]
    elif settings.api_workers > 1:
        listener = _listen(settings.host, settings.port)
        sockets = [listener]
        fd = listener.fileno()
        for i in range(2, settings.api_workers + 1):
            env = {**child_env(dict(os.environ), i), LISTEN_FD_ENV: str(fd)}
            children.append(ChildSpec(f"api-{i}", ["api"], env, pass_fds=(fd,)))
    supervisor = Supervisor(children, grace_s=settings.max_target_timeout_s) if children else None
    app = create_app(
        settings,
        run_services=run_services,
        scheduler_in_process=run_services and settings.scheduler_processes <= 1,
        supervisor=supervisor,
    )
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        lifespan="on",
        loop="uvloop",
        http="httptools",
        access_log=False,
        timeout_keep_alive=settings.http_keep_alive_s,
    )
    # Building the app imported the API stack: seconds on a busy machine.
    early_stop.exit_if_requested()
    _Server(config).run(sockets=sockets)
    early_stop.ignore_from_now()
    if supervisor is not None and supervisor.failed:
        raise SystemExit(1)


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.listen(2048)
    listener.set_inheritable(True)
    return listener
