"""Assertions on RFC 9457 problem responses: the status, the media type, and the fields named
in `errors[].field` (not a substring of the whole body, which a field's mere echo would pass)."""

from __future__ import annotations

from typing import Any

import httpx
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store.schema import metadata


def assert_problem(response: httpx.Response, status: int, *fields: str) -> dict[str, Any]:
    """The response is a problem with `status` whose errors name exactly `fields` (in any order)."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json"), response.headers
    body: dict[str, Any] = response.json()
    named = sorted(error["field"] for error in body.get("errors", []))
    assert named == sorted(fields), body
    return body


# Tables that move whatever a request's outcome: the rate limiter's buckets (every request
# is admitted or refused against them), the schedulers' own bookkeeping, and the quota's
# counter of unfinished jobs with its pending deltas (derived from jobs, which is counted:
# the triggers append to one as jobs change, a quota read folds them into the other).
NOT_REQUEST_STATE = frozenset(
    {"api_rate_buckets", "replicas", "partition_leases", "tenant_job_counts", "tenant_job_deltas"}
)


async def row_counts(engine: AsyncEngine) -> dict[str, int]:
    """Rows in every table a request can write (all but NOT_REQUEST_STATE, audit log
    included): "writes nothing" compares these before and after."""
    counts = {}
    async with engine.connect() as conn:
        for name, table in sorted(metadata.tables.items()):
            if name not in NOT_REQUEST_STATE:
                counts[name] = int(await conn.scalar(select(func.count()).select_from(table)) or 0)
    return counts
