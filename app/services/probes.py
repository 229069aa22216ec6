"""The scheduler's and reaper's own small HTTP server (CRONHOOK_METRICS_PORT): GET /metrics for
Prometheus, GET /healthz for liveness and GET /readyz for readiness (the process commits to
its database, app/db/watch.py). It runs on the role's event loop, so a loop that is stuck
stops answering /healthz and the container's health check notices.

A few lines of asyncio, not aiohttp.web: three GETs need no framework, and without it a
scheduler or reaper process never loads aiohttp (about 10 MB of its memory)."""

from __future__ import annotations

import asyncio
import errno
import json
import logging
from collections.abc import Callable

from app.db.watch import DB_WATCH, readiness
from app.logs import log_event
from app.metrics import exposition
from app.settings import Settings

logger = logging.getLogger(__name__)

# A request's head (request line and headers) is read whole, up to this size and time; there
# is never a body. Probers and Prometheus send a few hundred bytes.
MAX_HEAD_BYTES = 8192
READ_TIMEOUT_S = 5.0
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}
_JSON = "application/json"


class PortInUse(Exception):
    """The listen port is taken; the message names the setting that chooses it."""


# A route's answer: (status, content type, body).
Answer = tuple[int, str, bytes]


def _json(status: int, body: dict[str, str]) -> Answer:
    return status, _JSON, json.dumps(body).encode()


def _routes(warn_s: float) -> dict[str, Callable[[], Answer]]:
    def metrics() -> Answer:
        body, content_type = exposition()
        return 200, content_type, body

    def healthz() -> Answer:
        return _json(200, {"status": "ok"})

    def readyz() -> Answer:
        """503 with a reason while this process cannot commit to the database (app/db/watch.py)."""
        reason = readiness(DB_WATCH, warn_s)
        if reason is None:
            return _json(200, {"status": "ready"})
        return _json(503, {"status": "unavailable", "reason": reason})

    return {"/metrics": metrics, "/healthz": healthz, "/livez": healthz, "/readyz": readyz}


def answer_request(head: bytes, routes: dict[str, Callable[[], Answer]]) -> tuple[Answer, bool]:
    """The answer to a request's head, and whether it carries its body (not for HEAD)."""
    parts = head.split(b"\r\n", 1)[0].split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        return _json(400, {"status": "bad request"}), True
    method, target = parts[0], parts[1].split(b"?", 1)[0].decode("latin-1")
    route = routes.get(target)
    if route is None:
        return _json(404, {"status": "not found"}), method != b"HEAD"
    if method not in (b"GET", b"HEAD"):
        return _json(405, {"status": "method not allowed"}), True
    return route(), method == b"GET"


class ProbeServer:
    """The probe port: one request per connection (answered, then closed), on this loop."""

    def __init__(self, warn_s: float) -> None:
        self._routes = _routes(warn_s)
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._serve, host, port, limit=MAX_HEAD_BYTES)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT_S)
            (status, content_type, body), with_body = answer_request(head, self._routes)
            allow = "Allow: GET, HEAD\r\n" if status == 405 else ""
            writer.write(
                f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\n{allow}Connection: close\r\n\r\n".encode()
                + (body if with_body else b"")
            )
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            pass  # a prober that went away, or sent no head within limits: nothing to answer
        finally:
            writer.close()

    async def cleanup(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


async def start_probe_server(settings: Settings, role: str) -> ProbeServer | None:
    """Starts the server when CRONHOOK_METRICS_PORT is set; None when it is not."""
    if not settings.metrics_port:
        return None
    server = ProbeServer(settings.db_stall_warn_s)
    try:
        await server.start(settings.metrics_host, settings.metrics_port)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise PortInUse(
                f"port {settings.metrics_port} on {settings.metrics_host} is already in use: "
                "choose another with CRONHOOK_METRICS_PORT"
            ) from None
        raise
    log_event(logger, "probe_server_started", role=role, host=settings.metrics_host, port=settings.metrics_port)
    return server


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
