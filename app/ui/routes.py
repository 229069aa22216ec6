"""Console pages. Each is a server-rendered shell; console.js reads the page's `data-page`
and fills it from /v1 with the tab's key. The key never reaches these routes, so nothing
here can log it, and the console can do exactly what the key may do through the API."""

from __future__ import annotations

import functools
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

from app import __version__
from app.domain.health import Health
from app.domain.states import JobState

if TYPE_CHECKING:
    from fastapi.templating import Jinja2Templates

HERE = Path(__file__).parent


@functools.cache
def _templates() -> Jinja2Templates:
    """Jinja2 loads with the first page: most API processes never serve the console."""
    from fastapi.templating import Jinja2Templates

    return Jinja2Templates(directory=HERE / "templates")


router = APIRouter(prefix="/ui", include_in_schema=False)
# The pages load only our own script and style; no inline script runs.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
NAV = (
    ("overview", "Overview"),
    ("jobs", "Jobs"),
    ("dead-letters", "Dead letters"),
    ("targets", "Targets"),
    ("cluster", "Admin"),
)
# The "live" box reloads a page's data this often (console.js reads it from the page).
REFRESH_S = 10


def _page(request: Request, page: str, title: str, **context: object) -> HTMLResponse:
    return _templates().TemplateResponse(
        request,
        f"{page}.html",
        {"page": page, "title": title, "nav": NAV, "version": __version__, "refresh_s": REFRESH_S, **context},
        headers=SECURITY_HEADERS,
    )


@router.get("", response_model=None)
async def console_home() -> RedirectResponse:
    return RedirectResponse("/ui/overview", status_code=307)


@router.get("/overview", response_class=HTMLResponse)
async def overview_page(request: Request) -> HTMLResponse:
    return _page(request, "overview", "Overview")


@router.get("/jobs", response_class=HTMLResponse)
async def jobs_page(request: Request) -> HTMLResponse:
    return _page(request, "jobs", "Jobs", states=[s.value for s in JobState], healths=[h.value for h in Health])


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
async def job_page(request: Request, job_id: uuid.UUID) -> HTMLResponse:
    return _page(request, "job", "Job", job_id=str(job_id))


@router.get("/dead-letters", response_class=HTMLResponse)
async def dead_letters_page(request: Request) -> HTMLResponse:
    return _page(request, "dead-letters", "Dead letters")


@router.get("/targets", response_class=HTMLResponse)
async def targets_page(request: Request) -> HTMLResponse:
    return _page(request, "targets", "Targets")


@router.get("/cluster", response_class=HTMLResponse)
async def cluster_page(request: Request) -> HTMLResponse:
    return _page(request, "cluster", "Admin: cluster and keys")


def mount_console(app: FastAPI) -> None:
    app.include_router(router)
    app.mount("/ui/static", StaticFiles(directory=HERE / "static"), name="console-static")
