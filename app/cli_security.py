"""`cronhook api-key`, `cronhook secrets` and `cronhook tenant`: key lifecycle, secrets at
rest and per-tenant quotas from the command line (the admin API offers the same).

`api-key` verbs go through the admin API of the server named by `--server` or CRONHOOK_URL
(with CRONHOOK_ADMIN_API_KEY), so the key is the real server's; with no server named they
act on the database, and only on one that exists: they never start a fresh embedded one."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import sys
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from app.api.quotas import default_limits
from app.domain.quotas import FLOAT_LIMITS, LIMIT_FIELDS
from app.keyring import new_key_entry
from app.logs import log_event
from app.runtime import Runtime, run_role
from app.settings import Settings
from app.store.audit import audit_append
from app.store.quotas import tenant_limits_get, tenant_limits_set
from app.store.target_secrets import target_secrets_reseal
from app.store.tenants import api_key_create_row, api_key_list, api_key_revoke, tenant_ensure, tenant_get_id

if TYPE_CHECKING:
    from app.client.http import ApiClient

logger = logging.getLogger("app.cli")

ADMIN_KEY_VARIABLE = "CRONHOOK_ADMIN_API_KEY"


def add_security_commands(sub: Any) -> None:
    keys = sub.add_parser("api-key", help="manage API keys").add_subparsers(dest="action", required=True)
    create = keys.add_parser("create", help="create a key and print it (only the key) once")
    create.add_argument("--tenant", required=True, help="tenant name; created if new")
    create.add_argument("--name", help="a label shown in listings")
    create.set_defaults(func=_cmd_api_key_create)
    listing = keys.add_parser("list", help="list keys (id, prefix, tenant, state) as JSON lines")
    listing.add_argument("--tenant", help="only this tenant's keys")
    listing.set_defaults(func=_cmd_api_key_list)
    revoke = keys.add_parser("revoke", help="revoke a key by id, at once on every replica")
    revoke.add_argument("key_id", type=uuid.UUID)
    revoke.set_defaults(func=_cmd_api_key_revoke)
    for verb in (create, listing, revoke):
        verb.add_argument(
            "--server",
            help=f"the server's URL (CRONHOOK_URL): through its admin API, with {ADMIN_KEY_VARIABLE}. "
            "Without one: the database (CRONHOOK_DATABASE_URL, or an existing CRONHOOK_DATA_DIR)",
        )

    secrets_cmd = sub.add_parser("secrets", help="secrets at rest").add_subparsers(dest="action", required=True)
    secrets_cmd.add_parser(
        "rotate", help="re-seal every stored secret with the first key of CRONHOOK_SECRET_KEYS"
    ).set_defaults(func=_cmd_secrets_rotate)
    secrets_cmd.add_parser("new-key", help="print a new `id:base64key` entry for CRONHOOK_SECRET_KEYS").set_defaults(
        func=_cmd_secrets_new_key
    )

    tenant = sub.add_parser("tenant", help="tenants").add_subparsers(dest="action", required=True)
    limits = tenant.add_parser("limits", help="show or override a tenant's quotas (JSON)")
    limits.add_argument("--tenant", required=True)
    for name in LIMIT_FIELDS:
        limits.add_argument(f"--{name.replace('_', '-')}", type=_limit_value, help="a number, or `default`")
    limits.set_defaults(func=_cmd_tenant_limits)


def _named_server(args: argparse.Namespace) -> str | None:
    server: str | None = args.server or os.environ.get("CRONHOOK_URL") or None
    return server


def _through_admin_api(settings: Settings, server: str, request: Callable[[ApiClient], None]) -> None:
    """Runs `request` against the server's admin API; a refusal or silence is one line naming
    the server, and exit status 1 (refused), 2 (no admin key) or 3 (unreachable)."""
    if settings.admin_api_key is None:
        print(  # noqa: T201
            f"cronhook: api-key verbs against {server} go through its admin API: set {ADMIN_KEY_VARIABLE} "
            "(or its _FILE form) to that server's admin key",
            file=sys.stderr,
        )
        raise SystemExit(2)
    # httpx loads here, not in every service process that imports this module.
    from app.client.http import ApiClient, ApiError

    # One line per problem on stderr, not httpx's log of each request.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        key = settings.admin_api_key.get_secret_value()
        with ApiClient(server, key, key_variable=ADMIN_KEY_VARIABLE, key_source=ADMIN_KEY_VARIABLE) as api:
            request(api)
    except ApiError as exc:
        print(f"cronhook: {exc}", file=sys.stderr)  # noqa: T201
        raise SystemExit(exc.exit_code) from None


def _ensure_database_exists(settings: Settings) -> None:
    """With no CRONHOOK_DATABASE_URL the embedded server's data directory must be there
    already: a key written to a database started just now would open nothing."""
    if settings.database_url is not None:
        return
    pgdata = (settings.data_dir / "pg").resolve()
    if (pgdata / "PG_VERSION").is_file():
        return
    print(  # noqa: T201
        f"cronhook: no cronhook database at {pgdata} (CRONHOOK_DATA_DIR={settings.data_dir}), and api-key verbs "
        "never create one. Name the running server: CRONHOOK_URL (or --server) with CRONHOOK_ADMIN_API_KEY; "
        "or its database: CRONHOOK_DATABASE_URL, or CRONHOOK_DATA_DIR where it keeps its data",
        file=sys.stderr,
    )
    raise SystemExit(2)


def _cmd_api_key_create(settings: Settings, args: argparse.Namespace) -> None:
    if (server := _named_server(args)) is not None:

        def create(api: ApiClient) -> None:
            path = f"/v1/admin/tenants/{quote(args.tenant, safe='')}/api-keys"
            created = api.call("POST", path, json={"name": args.name})
            print(created["key"])  # noqa: T201

        _through_admin_api(settings, server, create)
        return
    _ensure_database_exists(settings)

    async def body(runtime: Runtime, stop: asyncio.Event) -> None:
        async with runtime.engine.begin() as conn:
            tenant_id = await tenant_ensure(conn, args.tenant)
            key, row = await api_key_create_row(conn, tenant_id, args.name)
            await audit_append(
                conn, tenant_id=tenant_id, actor="cli", action="createApiKey", object_id=str(row["id"]), request_id=None
            )
        log_event(logger, "api_key_created", tenant=args.tenant, key_id=str(row["id"]))
        print(key)  # noqa: T201

    run_role(settings, body, opens_secrets=False)


def _key_json(row: Any) -> str:
    return json.dumps({name: str(value) if value is not None else None for name, value in dict(row).items()})


def _cmd_api_key_list(settings: Settings, args: argparse.Namespace) -> None:
    if (server := _named_server(args)) is not None:

        def listing(api: ApiClient) -> None:
            for key in api.call("GET", "/v1/admin/api-keys", params={"tenant": args.tenant}):
                print(json.dumps(key))  # noqa: T201

        _through_admin_api(settings, server, listing)
        return
    _ensure_database_exists(settings)

    async def body(runtime: Runtime, stop: asyncio.Event) -> None:
        async with runtime.engine.begin() as conn:
            tenant_id = None
            if args.tenant is not None and (tenant_id := await tenant_get_id(conn, args.tenant)) is None:
                raise SystemExit(f"cronhook: no tenant {args.tenant!r}")
            for row in await api_key_list(conn, tenant_id):
                print(_key_json(row))  # noqa: T201

    run_role(settings, body, opens_secrets=False)


def _cmd_api_key_revoke(settings: Settings, args: argparse.Namespace) -> None:
    if (server := _named_server(args)) is not None:

        def revoke(api: ApiClient) -> None:
            print(json.dumps(api.call("POST", f"/v1/admin/api-keys/{args.key_id}/revoke")))  # noqa: T201

        _through_admin_api(settings, server, revoke)
        return
    _ensure_database_exists(settings)

    async def body(runtime: Runtime, stop: asyncio.Event) -> None:
        async with runtime.engine.begin() as conn:
            row = await api_key_revoke(conn, args.key_id)
            if row is None:
                raise SystemExit(f"cronhook: no API key {args.key_id}")
            tenant_id = await tenant_get_id(conn, row["tenant"])
            assert tenant_id is not None
            await audit_append(
                conn,
                tenant_id=tenant_id,
                actor="cli",
                action="revokeApiKey",
                object_id=str(args.key_id),
                request_id=None,
            )
        log_event(logger, "api_key_revoked", key_id=str(args.key_id))
        print(_key_json(row))  # noqa: T201

    run_role(settings, body, opens_secrets=False)


def _cmd_secrets_rotate(settings: Settings, args: argparse.Namespace) -> None:
    async def body(runtime: Runtime, stop: asyncio.Event) -> None:
        ring = runtime.key_ring
        changed = await target_secrets_reseal(runtime.engine, ring, everything=True)
        log_event(logger, "secrets_resealed", targets=changed, key_id=ring.primary_id)
        print(json.dumps({"resealed_targets": changed, "key_id": ring.primary_id}))  # noqa: T201

    run_role(settings, body)


def _cmd_secrets_new_key(settings: Settings, args: argparse.Namespace) -> None:
    print(new_key_entry())  # noqa: T201


def _limit_value(text: str) -> float | None:
    if text == "default":
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("a number, or `default`") from None


def _cmd_tenant_limits(settings: Settings, args: argparse.Namespace) -> None:
    async def body(runtime: Runtime, stop: asyncio.Event) -> None:
        given = {name: getattr(args, name) for name in LIMIT_FIELDS if f"--{name.replace('_', '-')}" in sys.argv}
        async with runtime.engine.begin() as conn:
            tenant_id = await tenant_get_id(conn, args.tenant)
            if tenant_id is None:
                raise SystemExit(f"cronhook: no tenant {args.tenant!r}")
            current = await tenant_limits_get(conn, tenant_id)
            if given:
                typed = {
                    name: None if value is None else (value if name in FLOAT_LIMITS else int(value))
                    for name, value in given.items()
                }
                current = await tenant_limits_set(conn, tenant_id, {**current, **typed})
                await audit_append(
                    conn,
                    tenant_id=tenant_id,
                    actor="cli",
                    action="setTenantLimits",
                    object_id=args.tenant,
                    request_id=None,
                )
        effective = default_limits(settings).overridden(current)
        print(json.dumps({"tenant": args.tenant, "effective": dataclasses.asdict(effective), "overrides": current}))  # noqa: T201

    run_role(settings, body, opens_secrets=False)
