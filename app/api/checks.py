"""Request checks the job routes share that need settings or the database: the payload
limit, a live target, and a job that exists."""

from __future__ import annotations

import uuid

from sqlalchemy.engine import RowMapping

from app.api.errors import Problem
from app.db.async_engine import AsyncConnection
from app.domain.payload import PayloadTooLarge, encode_within
from app.settings import Settings
from app.store.jobs import job_get
from app.store.targets import target_lock_live

JOB_NOT_FOUND = "job not found"


def ensure_payload_fits(payload: object, settings: Settings, field: str = "payload") -> str:
    """The payload's stored text (app/domain/payload.py), if it is within the limit."""
    try:
        return encode_within(payload, settings.max_payload_bytes)
    except PayloadTooLarge as refused:
        raise Problem(413, str(refused), slug="payload-too-large", field=field) from None


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
