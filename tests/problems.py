"""Assertions on RFC 9457 problem responses: the status, the media type, and the fields named
in `errors[].field` (not a substring of the whole body, which a field's mere echo would pass)."""

from __future__ import annotations

from typing import Any

import httpx
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store.tables import dead_letters, idempotency_keys, jobs, runs, targets


def assert_problem(response: httpx.Response, status: int, *fields: str) -> dict[str, Any]:
    """The response is a problem with `status` whose errors name exactly `fields` (in any order)."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json"), response.headers
    body: dict[str, Any] = response.json()
    named = sorted(error["field"] for error in body.get("errors", []))
    assert named == sorted(fields), body
    return body


async def row_counts(engine: AsyncEngine) -> dict[str, int]:
    """Rows in every table a request can write: "writes nothing" compares these before and after."""
    counts = {}
    async with engine.connect() as conn:
        for table in (targets, jobs, runs, dead_letters, idempotency_keys):
            counts[table.name] = int(await conn.scalar(select(func.count()).select_from(table)) or 0)
    return counts
