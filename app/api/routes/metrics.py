"""GET /metrics: the Prometheus exposition (app/metrics.py), unauthenticated like the probes;
keep the API port off the public internet or scrape through a proxy that restricts it."""

from __future__ import annotations

from fastapi import APIRouter, Response

from app.metrics import exposition

router = APIRouter(tags=["operations"])


@router.get("/metrics", include_in_schema=False)
async def metrics() -> Response:
    body, content_type = exposition()
    return Response(body, media_type=content_type)
