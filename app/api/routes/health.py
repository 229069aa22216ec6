"""Liveness and readiness probes (no auth)."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from app.api.deps import get_engine
from app.api.schemas.operations import Health, Readiness
from app.db.async_engine import AsyncEngine
from app.db.errors import is_transient_db_error, outage_reason
from app.db.schema_head import schema_is_current
from app.db.watch import readiness
from app.logs import log_event

router = APIRouter(tags=["health"])
logger = logging.getLogger(__name__)


@router.get("/healthz", operation_id="healthz")
async def healthz() -> Health:
    """Liveness: the process serves requests. Stays 200 through a database stall."""
    return Health(status="ok")


@router.get("/livez", operation_id="livez")
async def livez() -> Health:
    """/healthz under the name Kubernetes' probes use."""
    return Health(status="ok")


@router.get("/readyz", operation_id="readyz", response_model=Readiness, responses={503: {"model": Readiness}})
async def readyz(request: Request, engine: AsyncEngine = Depends(get_engine)) -> Readiness | JSONResponse:  # noqa: B008
    database = schema_current = False
    reason = None
    watch = getattr(request.app.state, "db_watch", None)
    try:
        # One round trip answers both: reading the revision needs a working connection.
        schema_current = await schema_is_current(engine)
        database = True
    except Exception as exc:
        if not is_transient_db_error(exc):
            raise
        reason = outage_reason(exc)
        # DEBUG: probes come every few seconds; the services log an outage once per episode.
        log_event(logger, "readiness_db_unavailable", logging.DEBUG, error=type(exc).__name__, reason=reason)
    if database and schema_current and watch is not None:
        # Reads work; do commits? And is anything delivering? (app/services/db_health.py)
        settings = request.app.state.settings
        reason = readiness(watch, settings.db_stall_warn_s)
        if reason is not None:
            body = Readiness(status="unavailable", database=True, schema_current=True, reason=reason)
            return JSONResponse(body.model_dump(), status_code=503)
    if database and schema_current:
        return Readiness(status="ready", database=True, schema_current=True)
    if database:
        reason = "the database schema is not at the revision this version needs (run cronhook migrate)"
    body = Readiness(status="unavailable", database=database, schema_current=schema_current, reason=reason)
    return JSONResponse(body.model_dump(), status_code=503)
