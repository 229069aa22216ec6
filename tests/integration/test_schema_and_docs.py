"""Migrations match app/store/tables.py; the committed OpenAPI matches the app; probes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.app import create_app
from app.db import schema_head
from app.db.engine import create_engine
from app.db.migrate import head_revision, schema_is_current
from app.settings import Settings
from app.store.schema import metadata
from tests.conftest import admin_execute, database_url, new_database_name

OPENAPI = Path(__file__).resolve().parents[2] / "openapi" / "openapi.json"


async def test_migrations_at_head_match_the_table_definitions(engine: AsyncEngine) -> None:
    def diff(sync_conn: Connection) -> list[Any]:
        context = MigrationContext.configure(sync_conn, opts={"compare_type": True})
        differences: list[Any] = compare_metadata(context, metadata)
        return differences

    async with engine.connect() as conn:
        assert await conn.run_sync(diff) == []
    assert await schema_is_current(engine)
    assert head_revision() is not None


async def test_the_light_schema_check_agrees_with_alembics(engine: AsyncEngine, pg_server_url: str) -> None:
    assert await schema_head.schema_is_current(engine)
    # A database never migrated: no revision table, not current (and no error).
    name = new_database_name("_bare")
    await admin_execute(pg_server_url, f'CREATE DATABASE "{name}"')
    bare = create_engine(database_url(pg_server_url, name), pool_size=1)
    try:
        assert not await schema_head.schema_is_current(bare)
        assert not await schema_is_current(bare)
    finally:
        await bare.dispose()
        await admin_execute(pg_server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# A process's start with migrations on (the default), in a fresh interpreter: the database's
# revision after it, and whether it loaded Alembic (with Mako and Pygments, ~10 MB that stay).
START = """
import asyncio, json, sys
from app.runtime import Runtime
from app.settings import Settings

async def main():
    runtime = Runtime(Settings(database_url=sys.argv[1], auto_migrate=True))
    engine = await runtime.start()
    from app.db.schema_head import schema_is_current
    current = await schema_is_current(engine)
    await runtime.stop()
    print(json.dumps({"current": current, "alembic": "alembic" in sys.modules, "mako": "mako" in sys.modules}))

asyncio.run(main())
"""


def start_with_migrations_on(url: str) -> dict[str, bool]:
    out = subprocess.run(
        [sys.executable, "-c", START, url], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    loaded: dict[str, bool] = json.loads(out.splitlines()[-1])
    return loaded


async def test_a_start_migrates_a_database_behind_and_skips_alembic_on_one_at_head(pg_server_url: str) -> None:
    """Every replica and restart runs with migrations on by default, and all but a release's
    first start find the schema current: those need not carry Alembic for their lifetime."""
    name = new_database_name("_bare")
    await admin_execute(pg_server_url, f'CREATE DATABASE "{name}"')
    url = database_url(pg_server_url, name)
    try:
        assert start_with_migrations_on(url) == {"current": True, "alembic": True, "mako": True}
        assert start_with_migrations_on(url) == {"current": True, "alembic": False, "mako": False}
    finally:
        await admin_execute(pg_server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_committed_openapi_matches_the_app() -> None:
    generated = create_app(Settings()).openapi()
    committed = json.loads(OPENAPI.read_text())
    assert committed == json.loads(json.dumps(generated)), "openapi/openapi.json is stale: run `make openapi`"


async def test_probes(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    ready = await client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready", "database": True, "schema_current": True, "reason": None}


async def test_readyz_reports_an_unreachable_database(settings: Settings) -> None:
    from app.db.engine import create_engine

    dead = create_engine("postgresql://postgres@127.0.0.1:1/nowhere", pool_size=1)
    app = create_app(settings, engine=dead)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
        response = await http.get("/readyz")
    await dead.dispose()
    assert response.status_code == 503
    assert response.json()["database"] is False


async def test_an_unexpected_error_is_a_bare_500_problem(settings: Settings, engine: AsyncEngine) -> None:
    app = create_app(settings, engine=engine)

    async def boom() -> None:
        raise RuntimeError("whsec_should_never_be_shown")

    app.add_api_route("/boom", boom)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        response = await http.get("/boom")
        # The connection stays usable: the next request is served normally.
        assert (await http.get("/healthz")).status_code == 200
    assert response.status_code == 500
    assert response.headers["content-type"] == "application/problem+json"
    assert "whsec_" not in response.text


async def test_a_failing_statement_leaks_no_parameter_to_response_or_logs(
    settings: Settings, engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    from sqlalchemy import text

    app = create_app(settings, engine=engine)

    async def bad_statement() -> None:
        async with engine.connect() as conn:
            # asyncpg quotes a value it cannot encode in its own error message.
            await conn.execute(text("SELECT CAST(:value AS integer)"), {"value": "whsec_secret_value"})

    app.add_api_route("/bad", bad_statement)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    with caplog.at_level("DEBUG"):
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            response = await http.get("/bad")
    assert response.status_code == 500
    assert "whsec_secret_value" not in response.text
    assert "whsec_secret_value" not in caplog.text
    assert any(getattr(r, "error", None) == "DBAPIError" for r in caplog.records)
