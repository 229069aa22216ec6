"""The `cronhook` command: run the service or one of its roles, migrate, manage API keys, check cron jobs."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from typing import Any

from pydantic import ValidationError

from app import __version__
from app.health_check import add_arguments as add_health_arguments
from app.health_check import check as check_health
from app.health_check import default_url as default_health_url
from app.keyring import KeyRingError
from app.logs import configure_logging, log_event
from app.processes import ChildSpec, Supervisor, attach_to_parent, scheduler_children
from app.runtime import Runtime, run_role, warn_if_egress_opened
from app.services.probes import PortInUse, ensure_port_free, start_probe_server
from app.services.startup import start_services
from app.settings import Settings

logger = logging.getLogger("app.cli")


def main(argv: list[str] | None = None) -> None:
    attach_to_parent()  # a child of `--processes`/`--workers`: stop with the parent
    words = sys.argv[1:] if argv is None else argv
    args = parser_for(words).parse_args(argv)
    if getattr(args, "client", False):
        # Client verbs talk to a server (CRONHOOK_URL, CRONHOOK_API_KEY); no service settings.
        from app.client.commands import run_client_command

        raise SystemExit(run_client_command(args))
    flags = _flag_settings(args)
    try:
        # Flags win over CRONHOOK_* variables and are validated with them: settings are
        # complete once built, and never changed after.
        settings = Settings(**flags)
    except ValidationError as exc:
        for error in exc.errors():
            field = ".".join(str(p) for p in error["loc"])
            name = _FLAGS[field] if field in flags else f"CRONHOOK_{field.upper()}" if field else "settings"
            print(f"cronhook: invalid {name}: {error['msg']}", file=sys.stderr)  # noqa: T201
        raise SystemExit(2) from None
    configure_logging(settings.log_level, settings.log_format)
    if args.command in _OPENS_SECRETS and getattr(args, "action", None) != "new-key":
        # Before anything starts: a process without the deployment's key ring would seal
        # secrets no other process opens (app/settings.py, load_key_ring).
        try:
            settings.load_key_ring()
        except KeyRingError as exc:
            print(f"cronhook: {exc}", file=sys.stderr)  # noqa: T201
            raise SystemExit(2) from None
    try:
        args.func(settings, args)
    except PortInUse as exc:
        print(f"cronhook: {exc}", file=sys.stderr)  # noqa: T201
        raise SystemExit(1) from None


# The settings a command line flag may give, by flag.
_FLAGS = {"host": "--host", "port": "--port", "scheduler_processes": "--processes", "api_workers": "--workers"}


def _flag_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings this command line gives (an empty --host gives none)."""
    given = {name: getattr(args, flag.removeprefix("--"), None) for name, flag in _FLAGS.items()}
    return {name: value for name, value in given.items() if value is not None and value != ""}


# The commands that seal or open target secrets, or start a process that does (`secrets
# new-key` only prints a key: it is how an operator without a ring makes one).
_OPENS_SECRETS = frozenset({"up", "api", "scheduler", "reaper", "migrate", "secrets"})


# The verbs that are not the client's: run in-process, with the service settings.
_SERVICE_VERBS = frozenset({"up", "api", "scheduler", "reaper", "migrate", "openapi", "health", "cron-check"})
# The verbs that run until stopped.
_ROLE_VERBS = frozenset({"up", "api", "scheduler", "reaper"})


def parser_for(words: list[str]) -> argparse.ArgumentParser:
    """The parser for a command line, holding only what its verb may need. A service verb's
    leaves the client verbs out: their modules (httpx, rich, YAML) would only weigh on every
    scheduler and reaper process (app/entry.py runs them itself). A long-running role's also
    leaves out the operator's commands (API keys, secrets, cron-check), whose store and quota
    modules it would otherwise carry for its lifetime."""
    first = words[0] if words else None
    return _parser(client_verbs=first not in _SERVICE_VERBS, operator_verbs=first not in _ROLE_VERBS)


def _parser(client_verbs: bool = True, operator_verbs: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cronhook", description=__doc__)
    parser.add_argument("--version", action="version", version=f"cronhook {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    for name, func, help_text in (
        ("up", _cmd_up, "API, scheduler and reaper in one process"),
        ("api", _cmd_api, "the HTTP API only"),
    ):
        cmd = sub.add_parser(name, help=help_text)
        cmd.add_argument("--host", help="listen address (CRONHOOK_HOST, default 127.0.0.1)")
        cmd.add_argument("--port", type=int, help="listen port (CRONHOOK_PORT, default 8080)")
        cmd.add_argument(
            "--workers", type=_positive, help="API processes sharing the port (CRONHOOK_API_WORKERS, default 1)"
        )
        if name == "up":
            _processes_arg(cmd)
        cmd.set_defaults(func=func)

    scheduler = sub.add_parser("scheduler", help="deliver due jobs")
    _processes_arg(scheduler)
    scheduler.set_defaults(func=_cmd_scheduler)
    sub.add_parser("reaper", help="rescue expired leases").set_defaults(func=_cmd_reaper)
    sub.add_parser("migrate", help="apply database migrations").set_defaults(func=_cmd_migrate)
    sub.add_parser("openapi", help="print the OpenAPI document").set_defaults(func=_cmd_openapi)

    health = sub.add_parser(
        "health",
        help="exit 0 when the server (--server, CRONHOOK_URL, else the local API or role) answers /healthz",
    )
    add_health_arguments(health)
    health.set_defaults(func=_cmd_health)
    if client_verbs:
        from app.client.commands import add_client_commands

        add_client_commands(sub)

    if operator_verbs:
        from app.cli_security import add_security_commands
        from app.cron_check import DEFAULT_FIRES, fires_arg

        add_security_commands(sub)
        check = sub.add_parser("cron-check", help="list cron jobs whose fire times changed with Vixie cron semantics")
        check.add_argument(
            "--fires", type=fires_arg, default=DEFAULT_FIRES, help="fire times compared per job (1-1000)"
        )
        check.add_argument("--json", action="store_true", help="one JSON object per job, a summary last")
        check.set_defaults(func=_cmd_cron_check)
    return parser


def _positive(value: str) -> int:
    number = int(value)
    if not 1 <= number <= 64:
        raise argparse.ArgumentTypeError("must be 1 to 64")
    return number


def _processes_arg(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument(
        "--processes",
        type=_positive,
        help="scheduler processes, each a replica (CRONHOOK_SCHEDULER_PROCESSES, default: one per CPU)",
    )


def _cmd_up(settings: Settings, args: argparse.Namespace) -> None:
    from app.serve import serve  # the API stack: imported by the roles that serve it only

    serve(settings, run_services=True)


def _cmd_api(settings: Settings, args: argparse.Namespace) -> None:
    from app.serve import serve

    serve(settings, run_services=False)


def _cmd_scheduler(settings: Settings, args: argparse.Namespace) -> None:
    ensure_port_free(settings.metrics_host, settings.metrics_port, "CRONHOOK_METRICS_PORT")
    warn_if_egress_opened(settings)
    children = scheduler_children(settings)
    if children:
        _supervise(settings, children)
        return

    async def body(runtime: Runtime, stop: asyncio.Event) -> None:
        services = start_services(runtime.engine, settings, stop, key_ring=runtime.key_ring, reaper=False)
        probes = await start_probe_server(settings, "scheduler")
        log_event(logger, "scheduler_started", replica_id=settings.replica_id)
        try:
            await services.stopped()
        finally:
            if probes is not None:
                await probes.cleanup()
            log_event(logger, "scheduler_stopped", replica_id=settings.replica_id)

    run_role(settings, body, generic_plans=True)


def _supervise(settings: Settings, children: list[ChildSpec]) -> None:
    """This process holds the database runtime and runs `children` until SIGTERM/SIGINT or
    until one of them exits; exit code 1 if any failed."""
    supervisor = Supervisor(children, grace_s=settings.max_target_timeout_s)

    async def body(runtime: Runtime, stop: asyncio.Event) -> None:
        supervisor.start()
        # Readiness here: this process commits, and a scheduler (its children) is alive.
        services = start_services(
            runtime.engine,
            settings,
            stop,
            key_ring=runtime.key_ring,
            scheduler=False,
            reaper=False,
            role="scheduler",
            read_cluster=True,
        )
        # The children's metrics, summed (PROMETHEUS_MULTIPROC_DIR), liveness and readiness.
        probes = await start_probe_server(settings, "scheduler")
        try:
            await supervisor.watch(stop)
        finally:
            stop.set()
            await supervisor.stop()
            await services.stopped()
            if probes is not None:
                await probes.cleanup()

    run_role(settings, body)
    if supervisor.failed:
        raise SystemExit(1)


def _cmd_reaper(settings: Settings, args: argparse.Namespace) -> None:
    ensure_port_free(settings.metrics_host, settings.metrics_port, "CRONHOOK_METRICS_PORT")

    async def body(runtime: Runtime, stop: asyncio.Event) -> None:
        services = start_services(runtime.engine, settings, stop, key_ring=runtime.key_ring, scheduler=False)
        probes = await start_probe_server(settings, "reaper")
        log_event(logger, "reaper_started")
        try:
            await services.stopped()
        finally:
            if probes is not None:
                await probes.cleanup()

    run_role(settings, body)


def _cmd_migrate(settings: Settings, args: argparse.Namespace) -> None:
    async def body(runtime: Runtime, stop: asyncio.Event) -> None:
        log_event(logger, "migrated")

    run_role(settings, body, migrate=True)


def _cmd_health(settings: Settings, args: argparse.Namespace) -> None:
    # `cronhook health` normally never gets here (app/entry.py answers it first).
    raise SystemExit(check_health(args.url or default_health_url(os.environ), args.ready))


def _cmd_openapi(settings: Settings, args: argparse.Namespace) -> None:
    from app.api.app import create_app

    print(json.dumps(create_app(settings).openapi(), indent=2, sort_keys=True))  # noqa: T201


def _cmd_cron_check(settings: Settings, args: argparse.Namespace) -> None:
    from app.cron_check import cron_check

    changed = 0

    async def body(runtime: Runtime, stop: asyncio.Event) -> None:
        nonlocal changed
        changed = await cron_check(runtime.engine, args.fires, sys.stdout, as_json=args.json)

    run_role(settings, body, opens_secrets=False)
    # Like diff: 1 when something is listed.
    raise SystemExit(1 if changed else 0)
