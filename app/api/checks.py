"""Request checks the job routes share that need settings or the database: the payload
limit, a live target, and a job that exists."""

from __future__ import annotations

import uuid

from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection

from app.api.errors import Problem
from app.domain.payload import payload_json
from app.settings import Settings
from app.store.jobs import job_get
from app.store.targets import target_lock_live

JOB_NOT_FOUND = "job not found"


def ensure_payload_fits(payload: object, settings: Settings, field: str = "payload") -> str:
    """The payload as JSON (what is stored), if it is within the limit."""
    encoded = payload_json(payload)
    payload_size = len(encoded) if encoded.isascii() else len(encoded.encode())
    if payload_size > settings.max_payload_bytes:
        raise Problem(
            413,
            f"payload is {payload_size} bytes; the limit is {settings.max_payload_bytes} (CRONHOOK_MAX_PAYLOAD_BYTES)",
            slug="payload-too-large",
            field=field,
        )
    return encoded


async def require_live_target(conn: AsyncConnection, tenant_id: uuid.UUID, target_id: uuid.UUID) -> None:
    """Share-locks the target, so that it cannot be deleted before this transaction commits.

    Unknown and foreign targets look the same: a tenant learns nothing of others' ids.
    """
    if not await target_lock_live(conn, tenant_id, target_id):
        raise Problem(422, "no such target", slug="validation", field="target_id")


async def existing_job(conn: AsyncConnection, tenant_id: uuid.UUID, job_id: uuid.UUID) -> RowMapping:
    row = await job_get(conn, tenant_id, job_id)
    if row is None:
        raise Problem(404, JOB_NOT_FOUND, slug="not-found")
    return row
