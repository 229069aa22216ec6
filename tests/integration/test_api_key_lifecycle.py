"""API key lifecycle (issue 11 item 3): recognisable keys with a checksum, listing and
revocation through the admin API and the CLI (effective at once: no auth cache), bootstrap
key retirement and the minimum length of configured keys."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import zlib
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr, ValidationError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.runtime import Runtime
from app.settings import Settings
from tests.conftest import ADMIN

CRONHOOK = shutil.which("cronhook") or str(Path(sys.executable).with_name("cronhook"))


async def test_a_created_key_is_recognisable_listed_and_revoked_at_once(admin_client: httpx.AsyncClient) -> None:
    created = await admin_client.post("/v1/admin/tenants/acme/api-keys", json={"name": "ci"}, headers=ADMIN)
    assert created.status_code == 201, created.text
    body = created.json()
    key = body["key"]
    key_id = key.split("_")[2]
    body_part, checksum = key.rsplit("_", 1)
    assert key.startswith("chk_live_") and body["key_prefix"] == f"chk_live_{key_id}"
    assert checksum == f"{zlib.crc32(body_part.encode()):08x}"
    auth = {"Authorization": f"Bearer {key}"}
    assert (await admin_client.get("/v1/targets", headers=auth)).status_code == 200

    listed = (await admin_client.get("/v1/admin/api-keys", params={"tenant": "acme"}, headers=ADMIN)).json()
    assert [(k["id"], k["name"], k["revoked_at"]) for k in listed] == [(body["id"], "ci", None)]
    assert key not in json.dumps(listed)

    revoked = await admin_client.post(f"/v1/admin/api-keys/{body['id']}/revoke", headers=ADMIN)
    assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
    # The very next request is refused: keys are looked up on every request.
    assert (await admin_client.get("/v1/targets", headers=auth)).status_code == 401


async def test_a_key_with_a_wrong_checksum_is_refused(admin_client: httpx.AsyncClient) -> None:
    key = (await admin_client.post("/v1/admin/tenants/acme/api-keys", headers=ADMIN)).json()["key"]
    tampered = key[:-1] + ("0" if key[-1] != "0" else "1")
    assert (await admin_client.get("/v1/targets", headers={"Authorization": f"Bearer {tampered}"})).status_code == 401


async def test_admin_key_endpoints_refuse_tenant_keys(admin_client: httpx.AsyncClient, auth: dict[str, str]) -> None:
    assert (await admin_client.get("/v1/admin/api-keys", headers=auth)).status_code == 403
    missing = await admin_client.post("/v1/admin/api-keys/00000000-0000-0000-0000-000000000000/revoke", headers=ADMIN)
    assert missing.status_code == 404


async def test_a_changed_bootstrap_key_retires_the_previous_one(
    settings: Settings, engine: AsyncEngine, client: httpx.AsyncClient
) -> None:
    first, second = "chk_first_bootstrap_key_0001", "chk_second_bootstrap_key_0002"
    for key in (first, second):
        runtime = Runtime(settings.model_copy(update={"bootstrap_api_key": SecretStr(key)}))
        try:
            await runtime.start(migrate=False)
        finally:
            await runtime.stop()
    assert (await client.get("/v1/targets", headers={"Authorization": f"Bearer {first}"})).status_code == 401
    assert (await client.get("/v1/targets", headers={"Authorization": f"Bearer {second}"})).status_code == 200


def test_short_bootstrap_and_admin_keys_are_refused() -> None:
    with pytest.raises(ValidationError, match="at least 20 characters"):
        Settings(bootstrap_api_key="short")
    with pytest.raises(ValidationError, match="at least 20 characters"):
        Settings(admin_api_key="short")


async def _cli(db_url: str, *args: str) -> tuple[int, str, str]:
    env = {**os.environ, "CRONHOOK_DATABASE_URL": db_url, "CRONHOOK_LOG_LEVEL": "ERROR"}
    proc = await asyncio.create_subprocess_exec(
        CRONHOOK, *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_the_cli_creates_lists_and_revokes_keys(db_url: str, client: httpx.AsyncClient) -> None:
    status, out, _ = await _cli(db_url, "api-key", "create", "--tenant", "cli-tenant", "--name", "ops")
    assert status == 0
    key = out.strip()
    auth = {"Authorization": f"Bearer {key}"}
    assert (await client.get("/v1/targets", headers=auth)).status_code == 200
    status, out, _ = await _cli(db_url, "api-key", "list", "--tenant", "cli-tenant")
    (listed,) = [json.loads(line) for line in out.splitlines()]
    assert listed["name"] == "ops" and listed["revoked_at"] is None and key not in out
    status, out, _ = await _cli(db_url, "api-key", "revoke", listed["id"])
    assert status == 0 and json.loads(out)["revoked_at"] is not None
    assert (await client.get("/v1/targets", headers=auth)).status_code == 401
