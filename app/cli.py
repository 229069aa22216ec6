"""The `cronhook` command: run the service or one of its roles, migrate, manage API keys, check cron jobs."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from collections.abc import Awaitable, Callable

import uvicorn
from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.app import create_app
from app.cli_security import add_security_commands
from app.cron_check import DEFAULT_FIRES, cron_check, fires_arg
from app.keyring import KeyRingError
from app.logs import configure_logging, log_event
from app.runtime import Runtime
from app.services.startup import start_services
from app.settings import Settings

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

    add_security_commands(sub)

    check = sub.add_parser("cron-check", help="list cron jobs whose fire times changed with Vixie cron semantics")
    check.add_argument("--fires", type=fires_arg, default=DEFAULT_FIRES, help="fire times compared per job (1-1000)")
    check.add_argument("--json", action="store_true", help="one JSON object per job, a summary last")
    check.set_defaults(func=_cmd_cron_check)
    return parser


def _warn_if_egress_opened(settings: Settings) -> None:
    """Deliveries (scheduler) and target URLs (API) may reach internal addresses: say so loudly."""
    policy = settings.egress_policy
    if not policy.is_default:
        log_event(
            logger,
            "egress_internal_allowed",
            logging.WARNING,
            allowed=policy.describe(),
            detail="webhook targets may reach these internal addresses and hosts (CRONHOOK_EGRESS_ALLOW)",
        )


def _serve(settings: Settings, run_services: bool) -> None:
    _warn_if_egress_opened(settings)
    app = create_app(settings, run_services=run_services)
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_config=None, lifespan="on")
    uvicorn.Server(config).run()


def _cmd_up(settings: Settings, args: argparse.Namespace) -> None:
    _serve(settings, run_services=True)


def _cmd_api(settings: Settings, args: argparse.Namespace) -> None:
    _serve(settings, run_services=False)


def _cmd_scheduler(settings: Settings, args: argparse.Namespace) -> None:
    _warn_if_egress_opened(settings)

    async def body(engine: AsyncEngine, stop: asyncio.Event) -> None:
        services = start_services(engine, settings, stop, reaper=False)
        log_event(logger, "scheduler_started", replica_id=settings.replica_id)
        try:
            await services.stopped()
        finally:
            log_event(logger, "scheduler_stopped", replica_id=settings.replica_id)

    run_role(settings, body)


def _cmd_reaper(settings: Settings, args: argparse.Namespace) -> None:
    async def body(engine: AsyncEngine, stop: asyncio.Event) -> None:
        services = start_services(engine, settings, stop, scheduler=False)
        log_event(logger, "reaper_started")
        await services.stopped()

    run_role(settings, body)


def _cmd_migrate(settings: Settings, args: argparse.Namespace) -> None:
    async def body(engine: AsyncEngine, stop: asyncio.Event) -> None:
        log_event(logger, "migrated")

    run_role(settings, body, migrate=True)


def _cmd_openapi(settings: Settings, args: argparse.Namespace) -> None:
    print(json.dumps(create_app(settings).openapi(), indent=2, sort_keys=True))  # noqa: T201


def _cmd_cron_check(settings: Settings, args: argparse.Namespace) -> None:
    changed = 0

    async def body(engine: AsyncEngine, stop: asyncio.Event) -> None:
        nonlocal changed
        changed = await cron_check(engine, args.fires, sys.stdout, as_json=args.json)

    run_role(settings, body)
    # Like diff: 1 when something is listed.
    raise SystemExit(1 if changed else 0)


def run_role(
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

    try:
        asyncio.run(runner())
    except KeyRingError as exc:
        print(f"cronhook: {exc}", file=sys.stderr)  # noqa: T201
        raise SystemExit(2) from None
