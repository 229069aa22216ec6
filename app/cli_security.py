"""`cronhook api-key`, `cronhook secrets` and `cronhook tenant`: key lifecycle, secrets at
rest and per-tenant quotas from the command line (the admin API offers the same)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import sys
import uuid
from typing import Any

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

logger = logging.getLogger("app.cli")


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


def _cmd_api_key_create(settings: Settings, args: argparse.Namespace) -> None:
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
    async def body(runtime: Runtime, stop: asyncio.Event) -> None:
        async with runtime.engine.begin() as conn:
            tenant_id = None
            if args.tenant is not None and (tenant_id := await tenant_get_id(conn, args.tenant)) is None:
                raise SystemExit(f"cronhook: no tenant {args.tenant!r}")
            for row in await api_key_list(conn, tenant_id):
                print(_key_json(row))  # noqa: T201

    run_role(settings, body, opens_secrets=False)


def _cmd_api_key_revoke(settings: Settings, args: argparse.Namespace) -> None:
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
