"""Migrations match app/store/tables.py; the committed OpenAPI matches the app; probes."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.app import create_app
from app.db.migrate import head_revision, schema_is_current
from app.settings import Settings
from app.store.tables import metadata

OPENAPI = Path(__file__).resolve().parents[2] / "openapi" / "openapi.json"


async def test_migrations_at_head_match_the_table_definitions(engine: AsyncEngine) -> None:
    def diff(sync_conn):  # type: ignore[no-untyped-def]
        context = MigrationContext.configure(sync_conn, opts={"compare_type": True})
        return compare_metadata(context, metadata)

    async with engine.connect() as conn:
        assert await conn.run_sync(diff) == []
    assert await schema_is_current(engine)
    assert head_revision() is not None


def test_committed_openapi_matches_the_app() -> None:
    generated = create_app(Settings()).openapi()
    committed = json.loads(OPENAPI.read_text())
    assert committed == json.loads(json.dumps(generated)), "openapi/openapi.json is stale: run `make openapi`"


async def test_probes(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    ready = await client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready", "database": True, "schema_current": True}


async def test_readyz_reports_an_unreachable_database(settings: Settings) -> None:
    from app.db.engine import create_engine

    dead = create_engine("postgresql://postgres@127.0.0.1:1/nowhere", pool_size=1)
    app = create_app(settings, engine=dead)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
        response = await http.get("/readyz")
    await dead.dispose()
    assert response.status_code == 503
    assert response.json()["database"] is False
