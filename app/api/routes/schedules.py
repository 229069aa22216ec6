"""/v1/schedules: answers "when exactly will this run?" without creating anything."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query

from app.api.deps import Conn, TenantId
from app.api.schemas.schedules import FireTime, SchedulePreview
from app.domain.cron import MAX_UPCOMING, CronError, load_zone, parse_cron, upcoming
from app.domain.cron_hash import has_hash, resolve_hashed
from app.domain.schedule import hash_seed
from app.store.jobs import db_now

router = APIRouter(prefix="/v1/schedules", tags=["schedules"])


@router.get("/preview", operation_id="previewSchedule")
async def preview_schedule(
    tenant_id: TenantId,
    conn: Conn,
    cron: Annotated[str, Query(min_length=1, max_length=200)],
    timezone: Annotated[str, Query(min_length=1, max_length=64)] = "UTC",
    count: Annotated[int, Query(ge=1, le=MAX_UPCOMING)] = 10,
    seed: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=200,
            description="For hashed values (`H`): a job's id resolves them as for that job; any other text "
            "as for a job of that id would",
        ),
    ] = None,
) -> SchedulePreview:
    resolved = cron
    if has_hash(cron):
        if seed is None:
            raise CronError("seed", "give a seed (a job id) to resolve the expression's hashed values (H)")
        resolved = resolve_hashed(cron, _seed(tenant_id, seed))
    spec = parse_cron(resolved)
    zone = load_zone(timezone)
    fires = upcoming(spec, timezone, await db_now(conn), count)
    items = []
    for instant in fires:
        local = instant.astimezone(zone)
        items.append(FireTime(at=local, utc=instant, utc_offset=local.isoformat()[-6:]))
    return SchedulePreview(cron=spec.expression, timezone=timezone, fire_times=items)


def _seed(tenant_id: uuid.UUID, seed: str) -> str:
    """The hash seed of the job whose id `seed` is (in any spelling of a UUID), else of `seed`."""
    try:
        return hash_seed(tenant_id, uuid.UUID(seed))
    except ValueError:
        return f"{tenant_id}:{seed}"
