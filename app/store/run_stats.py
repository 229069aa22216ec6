"""Delivery statistics drawn from the runs: per-bucket deliveries, failures and lateness, the
window's totals and percentiles, and the busiest targets. What the console's overview charts.

One statement, written as SQL (not rendered by app/store/statement_files.py), one round trip:
the runs of the window come through the BRIN index on `finished_at` (migration 0022), which
costs a delivery nothing to keep, and the tenant's rows are filtered from those pages."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import text

from app.db.async_engine import AsyncConnection

# Outcomes that are neither a success nor a deliberate stop count as failures. An open async
# attempt has no run row yet, so it is in neither.
_STATS = text(
    """
WITH recent AS (
    SELECT r.job_id,
           date_bin(make_interval(secs => :bucket_s), r.finished_at, timestamptz '2000-01-01 00:00:00+00') AS bucket,
           r.outcome = 'success' AS delivered,
           r.outcome NOT IN ('success', 'cancelled') AS failed,
           -- Lateness of first attempts only: a retry is late by its backoff, on purpose.
           CASE WHEN r.attempt = 1 AND r.started_at IS NOT NULL
                THEN greatest(0, extract(epoch FROM r.started_at - coalesce(r.fire_at, r.scheduled_for)) * 1000)
           END AS lateness_ms
      FROM runs r
     WHERE r.finished_at >= now() - make_interval(secs => :window_s)
       AND r.tenant_id = :tenant_id
),
buckets AS (
    SELECT bucket,
           count(*) FILTER (WHERE delivered) AS delivered,
           count(*) FILTER (WHERE failed) AS failed,
           percentile_cont(0.5) WITHIN GROUP (ORDER BY lateness_ms) AS p50,
           percentile_cont(0.99) WITHIN GROUP (ORDER BY lateness_ms) AS p99
      FROM recent GROUP BY bucket
),
busiest AS (
    SELECT j.target_id, count(*) AS attempts, count(*) FILTER (WHERE recent.failed) AS failed
      FROM recent JOIN jobs j ON j.id = recent.job_id
     GROUP BY j.target_id ORDER BY attempts DESC, j.target_id LIMIT :top
)
SELECT now() AS now,
       (SELECT coalesce(jsonb_agg(jsonb_build_object(
                   'at', bucket, 'delivered', delivered, 'failed', failed,
                   'lateness_p50_ms', round(p50::numeric, 1), 'lateness_p99_ms', round(p99::numeric, 1))
               ORDER BY bucket), '[]') FROM buckets) AS buckets,
       (SELECT jsonb_build_object(
                   'delivered', count(*) FILTER (WHERE delivered), 'failed', count(*) FILTER (WHERE failed),
                   'lateness_p50_ms', round((percentile_cont(0.5) WITHIN GROUP (ORDER BY lateness_ms))::numeric, 1),
                   'lateness_p95_ms', round((percentile_cont(0.95) WITHIN GROUP (ORDER BY lateness_ms))::numeric, 1),
                   'lateness_p99_ms', round((percentile_cont(0.99) WITHIN GROUP (ORDER BY lateness_ms))::numeric, 1))
          FROM recent) AS totals,
       (SELECT coalesce(jsonb_agg(jsonb_build_object(
                   'target_id', b.target_id, 'name', t.name, 'attempts', b.attempts, 'failed', b.failed)
               ORDER BY b.attempts DESC, b.target_id), '[]')
          FROM busiest b LEFT JOIN targets t ON t.id = b.target_id) AS busiest_targets
"""
)


async def run_stats_deliveries(
    conn: AsyncConnection, tenant_id: uuid.UUID, window_s: float, bucket_s: float, top: int
) -> dict[str, Any]:
    """The window's statistics, as the database's clock sees it (`now`)."""
    params = {"tenant_id": tenant_id, "window_s": window_s, "bucket_s": bucket_s, "top": top}
    row = (await conn.execute(_STATS, params)).mappings().one()
    return dict(row)
