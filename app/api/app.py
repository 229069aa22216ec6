"""The FastAPI application factory."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app import __version__
from app.api.contract import contract
from app.api.errors import CatchAll, install_error_handlers, problem_response
from app.api.job_creates import QuickCreate
from app.api.observability import RequestObservability
from app.api.quotas import Quotas
from app.api.routes import (
    admin,
    audit,
    check_ins,
    cluster,
    completions,
    dead_letters,
    event_subscriptions,
    health,
    job_batches,
    job_control,
    jobs,
    metrics,
    named_schedules,
    pauses,
    schedule_sets,
    schedules,
    stats,
    targets,
)
from app.api.routes.job_batches import BATCH_PATH
from app.api.warm_up import warm_up_api
from app.db.async_engine import AsyncEngine
from app.db.watch import DB_WATCH
from app.processes import Supervisor
from app.runtime import Runtime, settle_collector
from app.services.startup import start_services
from app.settings import Settings
from app.ui.routes import mount_console

logger = logging.getLogger(__name__)

# Room for the request's other fields around the largest allowed payload.
BODY_OVERHEAD_BYTES = 64 * 1024
# The `servers` entry of the published document: where `make run` listens.
DEFAULT_SERVER_URL = "http://127.0.0.1:8080"


def create_app(
    settings: Settings,
    engine: AsyncEngine | None = None,
    run_services: bool = False,
    *,
    scheduler_in_process: bool | None = None,
    supervisor: Supervisor | None = None,
) -> FastAPI:
    """With `engine`, the caller owns the database (tests). Without, the app's lifespan starts
    a Runtime, and with `run_services` also the reaper and the scheduler (`cronhook up`; the
    scheduler in this process unless `scheduler_in_process` is False), then `supervisor`'s
    child processes (app/processes.py), which it stops before the runtime."""
    in_process = run_services if scheduler_in_process is None else scheduler_in_process

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if engine is not None:
            yield
            return
        runtime = Runtime(settings)
        app.state.engine = await runtime.start()
        app.state.key_ring = runtime.key_ring
        app.state.quotas = Quotas(app.state.engine, settings)
        # Before the first request (and before settle_collector below): the create path's sessions
        # and statements, so a restart's first requests are not the ones that pay for them.
        try:
            await warm_up_api(app.state.engine, settings.db_pool_size)
        except BaseException:
            await runtime.stop()
            raise
        stop = asyncio.Event()
        services = start_services(
            app.state.engine,
            settings,
            stop,
            key_ring=runtime.key_ring,
            scheduler=in_process,
            reaper=run_services,
            role="up" if run_services else "api",
            # `cronhook up` is ready once its schedulers (in this process or its children)
            # hold their partitions: a job due in its first seconds is then on time.
            await_schedulers=max(1, settings.scheduler_processes) if run_services else 0,
        )
        # /readyz follows this process's commits and the cluster's schedulers from now on.
        app.state.db_watch = DB_WATCH
        settle_collector()
        watcher = None
        if supervisor is not None:
            supervisor.start()
            watcher = asyncio.create_task(_stop_server_if_a_child_exits(supervisor, stop))
        try:
            yield
        finally:
            stop.set()
            try:
                if supervisor is not None and watcher is not None:
                    await watcher
                    await supervisor.stop()
                await services.stopped()
            finally:
                await runtime.stop()

    app = FastAPI(
        title="cronhook",
        version=__version__,
        description="Schedule webhooks: once, after a delay, on a cron expression, or at a fixed interval.",
        lifespan=lifespan,
        # FastAPI's own OpenTelemetry (0.165+) asks the global providers on every request
        # whether it is on (~4 % of a create's CPU); cronhook's telemetry is its Prometheus
        # metrics and JSON logs, and it configures no OpenTelemetry provider.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.settings = settings
    # POST /v1/jobs's quick branch (app/api/job_creates.py), with the keys this app has seen.
    app.state.quick_create = QuickCreate()
    if engine is not None:
        # The caller owns the database (tests): the key ring comes from settings here.
        app.state.engine = engine
        app.state.quotas = Quotas(engine, settings)
        app.state.key_ring = settings.load_key_ring()
    install_error_handlers(app)
    # POST /v1/jobs first, on the app's router itself (its own route class, JobCreateRoute).
    jobs.add_create_route(app.router)
    for router in (
        targets.router,
        jobs.router,
        completions.router,
        job_batches.router,
        job_control.router,
        dead_letters.router,
        schedules.router,
        named_schedules.router,
        schedule_sets.router,
        event_subscriptions.router,
        check_ins.router,
        pauses.router,
        audit.router,
        stats.router,
        admin.router,
        cluster.router,
        health.router,
        metrics.router,
    ):
        app.include_router(router)
    mount_console(app)
    app.add_middleware(
        BodySizeLimit,
        max_bytes=settings.max_payload_bytes + BODY_OVERHEAD_BYTES,
        by_path={BATCH_PATH: settings.max_batch_bytes},
        # A set of thousands of schedules is one body, as a batch of jobs is.
        by_prefix={"/v1/schedule-sets/": settings.max_batch_bytes},
    )
    # Added after BodySizeLimit, so it wraps everything above: nothing unexpected escapes to the server.
    app.add_middleware(CatchAll)
    # Outermost: the request id and access line cover every answer, 500s included.
    app.add_middleware(RequestObservability)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = contract(app, DEFAULT_SERVER_URL)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


async def _stop_server_if_a_child_exits(supervisor: Supervisor, stop: asyncio.Event) -> None:
    if await supervisor.watch(stop) is not None:
        # Stop this server the way SIGTERM does; the lifespan then stops the other children.
        signal.raise_signal(signal.SIGTERM)


class BodySizeLimit:
    """Rejects request bodies over `max_bytes` with 413, whether or not Content-Length is sent.

    The body is buffered (it is small by construction) and replayed to the app, so nothing
    downstream ever sees a truncated request.
    """

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        by_path: dict[str, int] | None = None,
        by_prefix: dict[str, int] | None = None,
    ) -> None:
        self.app = app
        self.default_max_bytes = max_bytes
        self.by_path = by_path or {}
        # Paths with a name in them (a schedule set's): their limit by leading part.
        self.by_prefix = by_prefix or {}

    def _limit(self, path: str) -> int:
        limit = self.by_path.get(path)
        if limit is not None:
            return limit
        for prefix, prefix_limit in self.by_prefix.items():
            if path.startswith(prefix):
                return prefix_limit
        return self.default_max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        max_bytes = self._limit(scope["path"])
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > max_bytes:
            await self._reject(scope, receive, send, max_bytes)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break  # client went away; let the app see an empty body
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > max_bytes:
                await self._reject(scope, receive, send, max_bytes)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _reject(self, scope: Scope, receive: Receive, send: Send, max_bytes: int) -> None:
        response = problem_response(
            Request(scope),
            413,
            f"request body exceeds {max_bytes} bytes",
            slug="payload-too-large",
            errors=[{"field": "body", "message": "too large"}],
        )
        await response(scope, receive, send)
