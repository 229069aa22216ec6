"""The FastAPI application factory."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app import __version__
from app.api.audit import RequestId
from app.api.errors import CatchAll, install_error_handlers, problem_response
from app.api.quotas import Quotas
from app.api.routes import admin, audit, cluster, dead_letters, health, job_control, jobs, schedules, targets
from app.keyring import install_key_ring
from app.runtime import Runtime
from app.services.startup import start_services
from app.settings import Settings

logger = logging.getLogger(__name__)

# Room for the request's other fields around the largest allowed payload.
BODY_OVERHEAD_BYTES = 64 * 1024


def create_app(settings: Settings, engine: AsyncEngine | None = None, run_services: bool = False) -> FastAPI:
    """With `engine`, the caller owns the database (tests). Without, the app's lifespan starts
    a Runtime, and with `run_services` also the scheduler and reaper (`cronhook up`)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if engine is not None:
            yield
            return
        runtime = Runtime(settings)
        app.state.engine = await runtime.start()
        app.state.quotas = Quotas(app.state.engine, settings)
        stop = asyncio.Event()
        services = start_services(app.state.engine, settings, stop, scheduler=run_services, reaper=run_services)
        try:
            yield
        finally:
            stop.set()
            try:
                await services.stopped()
            finally:
                await runtime.stop()

    app = FastAPI(
        title="cronhook",
        version=__version__,
        description="Schedule webhooks: once, after a delay, on a cron expression, or at a fixed interval.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    if engine is not None:
        # The caller owns the database (tests): the process's key ring comes from settings here.
        app.state.engine = engine
        app.state.quotas = Quotas(engine, settings)
        install_key_ring(settings.load_key_ring())
    install_error_handlers(app)
    for module in (targets, jobs, job_control, dead_letters, schedules, audit, admin, cluster, health):
        app.include_router(module.router)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_payload_bytes + BODY_OVERHEAD_BYTES)
    app.add_middleware(RequestId)
    # Added last, so it wraps everything above: nothing unexpected escapes to the server.
    app.add_middleware(CatchAll)
    return app


class BodySizeLimit:
    """Rejects request bodies over `max_bytes` with 413, whether or not Content-Length is sent.

    The body is buffered (it is small by construction) and replayed to the app, so nothing
    downstream ever sees a truncated request.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._reject(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break  # client went away; let the app see an empty body
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._reject(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _reject(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = problem_response(
            Request(scope),
            413,
            f"request body exceeds {self.max_bytes} bytes",
            slug="payload-too-large",
            errors=[{"field": "body", "message": "too large"}],
        )
        await response(scope, receive, send)
