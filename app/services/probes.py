"""The scheduler's and reaper's own small HTTP server (CRONHOOK_METRICS_PORT): GET /metrics for
Prometheus, GET /healthz for liveness and GET /readyz for readiness (the process commits to
its database, app/db/watch.py). It runs on the role's event loop, so a loop that is stuck
stops answering /healthz and the container's health check notices."""

from __future__ import annotations

import errno
import logging

from aiohttp import web

from app.db.watch import DB_WATCH, readiness
from app.logs import log_event
from app.metrics import exposition
from app.settings import Settings

logger = logging.getLogger(__name__)
_WARN_S = web.AppKey("warn_s", float)


class PortInUse(Exception):
    """The listen port is taken; the message names the setting that chooses it."""


async def _metrics(request: web.Request) -> web.Response:
    body, content_type = exposition()
    return web.Response(body=body, headers={"Content-Type": content_type})


async def _healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _readyz(request: web.Request) -> web.Response:
    """503 with a reason while this process cannot commit to the database (app/db/watch.py)."""
    reason = readiness(DB_WATCH, request.app[_WARN_S])
    if reason is None:
        return web.json_response({"status": "ready"})
    return web.json_response({"status": "unavailable", "reason": reason}, status=503)


async def start_probe_server(settings: Settings, role: str) -> web.AppRunner | None:
    """Starts the server when CRONHOOK_METRICS_PORT is set; None when it is not."""
    if not settings.metrics_port:
        return None
    app = web.Application()
    app[_WARN_S] = settings.db_stall_warn_s
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/livez", _healthz)
    app.router.add_get("/readyz", _readyz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, settings.metrics_host, settings.metrics_port).start()
    except OSError as exc:
        await runner.cleanup()
        if exc.errno == errno.EADDRINUSE:
            raise PortInUse(
                f"port {settings.metrics_port} on {settings.metrics_host} is already in use: "
                "choose another with CRONHOOK_METRICS_PORT"
            ) from None
        raise
    log_event(logger, "probe_server_started", role=role, host=settings.metrics_host, port=settings.metrics_port)
    return runner


def ensure_port_free(host: str, port: int, setting: str) -> None:
    """Fails before anything starts (the embedded database, migrations) when `port` is taken."""
    import socket

    if port == 0:
        return
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        # As the server will bind: a port left in TIME_WAIT by a previous run is free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortInUse(f"port {port} on {host} is already in use: choose another with {setting}") from None
            raise
