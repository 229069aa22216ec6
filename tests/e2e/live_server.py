"""A real `cronhook up` (or `api`) process on a free 127.0.0.1 port, for tests that drive the
service the way a user's client does: generated clients, the CLI, the browser console."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx

from tests.e2e.test_processes import Processes, base_env, free_port, wait_until_ready


@dataclass(frozen=True)
class LiveServer:
    url: str
    key: str
    admin_key: str
    env: dict[str, str]

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}


@asynccontextmanager
async def live_server(procs: Processes, db_url: str, role: str = "up", **env: str) -> AsyncIterator[LiveServer]:
    port = free_port()
    # Not `chk_live_`: such keys carry a checksum (app/store/tenants.py), a bootstrap key needs none.
    key = f"chk_test_{secrets.token_hex(16)}"
    admin_key = f"admin_{secrets.token_hex(8)}"
    full_env = base_env(
        CRONHOOK_DATABASE_URL=db_url,
        CRONHOOK_BOOTSTRAP_API_KEY=key,
        CRONHOOK_ADMIN_API_KEY=admin_key,
        CRONHOOK_POLL_INTERVAL_S="0.1",
        **env,
    )
    procs.start(role, [role, "--port", str(port)], full_env)
    url = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(base_url=url) as http:
        await wait_until_ready(http, timeout=30)
    yield LiveServer(url, key, admin_key, full_env)
