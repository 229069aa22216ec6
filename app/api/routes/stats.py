"""/v1/stats: the tenant's deliveries over the last hour or day, from its runs."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query

from app.api.deps import Conn, TenantId
from app.api.schemas.stats import DeliveryStats
from app.store.run_stats import run_stats_deliveries

router = APIRouter(prefix="/v1/stats", tags=["stats"])

# Per-minute buckets over either window: 60 or 1,440 points, what a chart draws at once.
WINDOWS = {"1h": 3600, "24h": 86_400}
BUCKET_S = 60
BUSIEST = 5


@router.get("/deliveries", operation_id="getDeliveryStats")
async def delivery_stats(
    tenant_id: TenantId,
    conn: Conn,
    window: Annotated[Literal["1h", "24h"], Query(description="The last hour or day, in one-minute buckets")] = "1h",
) -> DeliveryStats:
    """Attempts per minute (succeeded, failed), first attempts' lateness percentiles, and the
    five busiest targets, drawn from the runs the retention period keeps."""
    row = await run_stats_deliveries(conn, tenant_id, float(WINDOWS[window]), float(BUCKET_S), BUSIEST)
    return DeliveryStats(window=window, bucket_s=BUCKET_S, **row)
