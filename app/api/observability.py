"""Per-request observability: a request id (the client's `X-Request-Id` when sane, else a new
one) on the response and on every log line of the request, one INFO access line, and the API
metrics by route template and status.

The access line names method, route template, path, status and duration; never headers (the
API key), query strings or bodies.
"""

from __future__ import annotations

import logging
import re
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.ids import new_id
from app.logs import REQUEST_ID, log_event
from app.metrics import API_REQUESTS, API_SECONDS

logger = logging.getLogger("app.access")

HEADER = b"x-request-id"
_SANE_ID = re.compile(rb"^[A-Za-z0-9._:-]{1,64}$")
# Scrapes and probes would drown the access log; they are still counted.
QUIET_ROUTES = frozenset({"/metrics", "/healthz", "/livez", "/readyz"})


class RequestObservability:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers", [])).get(HEADER)
        request_id = given.decode() if given and _SANE_ID.match(given) else new_id().hex
        token = REQUEST_ID.set(request_id)
        started = time.perf_counter()
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), (HEADER, request_id.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            elapsed = time.perf_counter() - started
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            method = scope["method"]
            API_REQUESTS.labels(method, route, str(status)).inc()
            API_SECONDS.labels(method, route).observe(elapsed)
            if route not in QUIET_ROUTES:
                log_event(
                    logger,
                    "http_request",
                    method=method,
                    route=route,
                    path=scope["path"],
                    status=status,
                    duration_ms=round(elapsed * 1000, 1),
                )
            REQUEST_ID.reset(token)
