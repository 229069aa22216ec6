"""The health watch, one of the reaper's passes (app/services/reaper.py): jobs whose health
verdict changed (app/domain/health.py) have it recorded and reported, job.health.failing
when one starts failing and job.health.recovered when it stops, each in the transaction that
records it (app/store/health.py), so each edge is reported exactly once. Edges are taken in
batches of `limit`, each its own short transaction, until none is left; jobs a claim or an
outcome holds are skipped, and looked at again next pass.

Then, at most once every JOBS_BY_HEALTH_EVERY_S, the gauge of unfinished jobs by health
(cronhook_jobs_by_health) is sampled: one count of every unfinished job by the health it
shows, a scan (about as long as the pass itself at 100,000 jobs, bench/health.py), so not
made every pass; a gauge scraped every 15-60 s loses nothing by it.
"""

from __future__ import annotations

import logging

from app import metrics
from app.db.async_engine import AsyncEngine
from app.domain.health import HealthDefaults
from app.logs import log_event
from app.store.health import health_watch_edges, job_count_by_health

logger = logging.getLogger(__name__)

JOBS_BY_HEALTH_EVERY_S = 60.0


async def health_watch_once(engine: AsyncEngine, defaults: HealthDefaults, limit: int) -> int:
    """Records and reports every health edge; returns how many (failing and recovered)."""
    reported = 0
    while True:
        async with engine.begin() as conn:
            edges = await health_watch_edges(conn, defaults, limit)
        if edges.failing or edges.recovered:
            log_event(logger, "health_edges", logging.INFO, failing=edges.failing, recovered=edges.recovered)
        reported += edges.failing + edges.recovered
        if not edges.more:
            break
    if metrics.jobs_by_health_due(JOBS_BY_HEALTH_EVERY_S):
        async with engine.connect() as conn:
            metrics.jobs_by_health(await job_count_by_health(conn))
    return reported
