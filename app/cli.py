"""The `cronhook` command: run the service or one of its roles, migrate, manage API keys."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Iterator

import uvicorn
from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.app import create_app
from app.logs import configure_logging, log_event
from app.runtime import Runtime
from app.services.loop import run_forever
from app.services.reaper import Reaper, ReaperConfig
from app.services.scheduler import Scheduler, SchedulerConfig
from app.settings import Settings
from app.store.tenants import api_key_create, tenant_ensure

logger = logging.getLogger("app.cli")


def main(argv: list[str] | None = None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        settings = Settings()
    except ValidationError as exc:
        for error in exc.errors():
            field = ".".join(str(p) for p in error["loc"])
            name = f"CRONHOOK_{field.upper()}" if field else "settings"
            print(f"cronhook: invalid {name}: {error['msg']}", file=sys.stderr)  # noqa: T201
        raise SystemExit(2) from None
    configure_logging(settings.log_level)
    if getattr(args, "host", None):
        settings.host = args.host
    if getattr(args, "port", None) is not None:
        settings.port = args.port
    args.func(settings, args)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cronhook", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    for name, func, help_text in (
        ("up", _cmd_up, "API, scheduler and reaper in one process"),
        ("api", _cmd_api, "the HTTP API only"),
    ):
        cmd = sub.add_parser(name, help=help_text)
        cmd.add_argument("--host", help="listen address (CRONHOOK_HOST, default 127.0.0.1)")
        cmd.add_argument("--port", type=int, help="listen port (CRONHOOK_PORT, default 8080)")
        cmd.set_defaults(func=func)

    sub.add_parser("scheduler", help="deliver due jobs").set_defaults(func=_cmd_scheduler)
    sub.add_parser("reaper", help="rescue expired leases").set_defaults(func=_cmd_reaper)
    sub.add_parser("migrate", help="apply database migrations").set_defaults(func=_cmd_migrate)
    sub.add_parser("openapi", help="print the OpenAPI document").set_defaults(func=_cmd_openapi)

    keys = sub.add_parser("api-key", help="manage API keys").add_subparsers(dest="action", required=True)
    create = keys.add_parser("create", help="create a key and print it (only the key) once")
    create.add_argument("--tenant", required=True, help="tenant name; created if new")
    create.set_defaults(func=_cmd_api_key_create)
    return parser


class _Server(uvicorn.Server):
    """uvicorn re-raises a SIGINT/SIGTERM it handled once shutdown is complete, so the process
    died of the signal (exit 143) after a clean stop; like every other role, exit 0 instead."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        with super().capture_signals():
            yield
            self._captured_signals.clear()


def _serve(settings: Settings, run_services: bool) -> None:
    app = create_app(settings, run_services=run_services)
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_config=None, lifespan="on")
    _Server(config).run()


def _cmd_up(settings: Settings, args: argparse.Namespace) -> None:
    _serve(settings, run_services=True)


def _cmd_api(settings: Settings, args: argparse.Namespace) -> None:
    _serve(settings, run_services=False)


def _cmd_scheduler(settings: Settings, args: argparse.Namespace) -> None:
    async def body(engine: AsyncEngine, stop: asyncio.Event) -> None:
        scheduler = Scheduler(engine, SchedulerConfig.from_settings(settings))
        log_event(logger, "scheduler_started", replica_id=settings.replica_id)
        try:
            await scheduler.run_forever(stop)
        finally:
            await scheduler.close(grace_s=settings.max_target_timeout_s)
            log_event(logger, "scheduler_stopped", replica_id=settings.replica_id)

    _run_role(settings, body)


def _cmd_reaper(settings: Settings, args: argparse.Namespace) -> None:
    async def body(engine: AsyncEngine, stop: asyncio.Event) -> None:
        reaper = Reaper(engine, ReaperConfig.from_settings(settings))
        log_event(logger, "reaper_started")
        await run_forever(reaper, stop, logging.getLogger("app.services.reaper"))

    _run_role(settings, body)


def _cmd_migrate(settings: Settings, args: argparse.Namespace) -> None:
    async def body(engine: AsyncEngine, stop: asyncio.Event) -> None:
        log_event(logger, "migrated")

    _run_role(settings, body, migrate=True)


def _cmd_openapi(settings: Settings, args: argparse.Namespace) -> None:
    print(json.dumps(create_app(settings).openapi(), indent=2, sort_keys=True))  # noqa: T201


def _cmd_api_key_create(settings: Settings, args: argparse.Namespace) -> None:
    async def body(engine: AsyncEngine, stop: asyncio.Event) -> None:
        async with engine.begin() as conn:
            tenant_id = await tenant_ensure(conn, args.tenant)
            key = await api_key_create(conn, tenant_id)
        log_event(logger, "api_key_created", tenant=args.tenant)
        print(key)  # noqa: T201

    _run_role(settings, body)


def _run_role(
    settings: Settings,
    body: Callable[[AsyncEngine, asyncio.Event], Awaitable[None]],
    migrate: bool | None = None,
) -> None:
    """Runs `body` with a database, stopping cleanly on SIGINT/SIGTERM."""

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        runtime = Runtime(settings)
        try:
            engine = await runtime.start(migrate=migrate)
            await body(engine, stop)
        finally:
            await runtime.stop()

    asyncio.run(runner())
