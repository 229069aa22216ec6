"""/v1/schedules: answers "when exactly will this run?" without creating anything."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from app.api.deps import Conn, TenantId
from app.api.schemas.schedules import FireTime, SchedulePreview
from app.domain.cron import MAX_UPCOMING, load_zone, parse_cron, upcoming
from app.store.jobs import db_now

router = APIRouter(prefix="/v1/schedules", tags=["schedules"])


@router.get("/preview", operation_id="previewSchedule")
async def preview_schedule(
    tenant_id: TenantId,
    conn: Conn,
    cron: Annotated[str, Query(min_length=1, max_length=200)],
    timezone: Annotated[str, Query(min_length=1, max_length=64)] = "UTC",
    count: Annotated[int, Query(ge=1, le=MAX_UPCOMING)] = 10,
) -> SchedulePreview:
    spec = parse_cron(cron)
    zone = load_zone(timezone)
    fires = upcoming(spec, timezone, await db_now(conn), count)
    items = []
    for instant in fires:
        local = instant.astimezone(zone)
        items.append(FireTime(at=local, utc=instant, utc_offset=local.isoformat()[-6:]))
    return SchedulePreview(cron=spec.expression, timezone=timezone, fire_times=items)
