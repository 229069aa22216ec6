"""RFC 9457 problem+json for every error the API returns, from one set of handlers."""

from __future__ import annotations

import logging
import traceback
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.db.errors import is_transient_db_error
from app.domain.job_plan import PlanError
from app.domain.schedule import ScheduleError
from app.logs import log_event
from app.store.pagination import InvalidCursor

logger = logging.getLogger(__name__)

PROBLEM_JSON = "application/problem+json"
# RFC 9110's reason phrases: every status the API answers with has its own (tests/unit/test_contract_types.py).
TITLES = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    410: "Gone",
    412: "Precondition Failed",
    413: "Content Too Large",
    415: "Unsupported Media Type",
    422: "Unprocessable Content",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


class Problem(Exception):
    """Raise from a route to answer with a problem document."""

    def __init__(
        self,
        status: int,
        detail: str,
        *,
        slug: str | None = None,
        field: str | None = None,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.slug = slug
        self.field = field
        self.headers = headers
        self.extra = extra or {}


def problem_item(problem: Problem) -> dict[str, Any]:
    """A problem inside a 207 answer's item (a batch's conflict): the document's members, with
    the field named at the top level."""
    body: dict[str, Any] = {
        "type": f"urn:cronhook:problem:{problem.slug}" if problem.slug else "about:blank",
        "title": TITLES.get(problem.status, "Error"),
        "status": problem.status,
        "detail": problem.detail,
    }
    if problem.field is not None:
        body["field"] = problem.field
    body.update(problem.extra)
    return body


def problem_response(
    request: Request,
    status: int,
    detail: str,
    *,
    slug: str | None = None,
    errors: list[dict[str, str]] | None = None,
    headers: dict[str, str] | None = None,
    extra: dict[str, Any] | None = None,
) -> JSONResponse:
    body: dict[str, Any] = {
        "type": f"urn:cronhook:problem:{slug}" if slug else "about:blank",
        "title": TITLES.get(status, "Error"),
        "status": status,
        "detail": detail,
        "instance": request.url.path,
    }
    if errors:
        body["errors"] = errors
    if extra:
        body.update(extra)
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON, headers=headers)


def field_error(field: str, message: str) -> list[dict[str, str]]:
    return [{"field": field, "message": message}]


def _field_name(loc: tuple[Any, ...]) -> str:
    # ("body", "headers", "X-Foo") -> "headers.X-Foo"; ("query", "limit") -> "limit";
    # ("body", "jobs", 3, "cron") -> "jobs[3].cron"
    name = ""
    for part in loc:
        if part in ("body", "query", "path", "header"):
            continue
        name += f"[{part}]" if isinstance(part, int) else f".{part}" if name else str(part)
    return name or "body"


# What FastAPI raises (as a 400) when decoding the body fails other than as a JSONDecodeError.
FASTAPI_BODY_PARSE_ERROR = "There was an error parsing the body"


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(Problem)
    async def _problem(request: Request, exc: Problem) -> JSONResponse:
        errors = field_error(exc.field, exc.detail) if exc.field else None
        return problem_response(
            request,
            exc.status,
            exc.detail,
            slug=exc.slug,
            errors=errors,
            headers=exc.headers,
            extra=exc.extra,
        )

    @app.exception_handler(ScheduleError)
    async def _schedule(request: Request, exc: ScheduleError) -> JSONResponse:
        return problem_response(
            request,
            422,
            f"{exc.field}: {exc.message}",
            slug="validation",
            errors=field_error(exc.field, exc.message),
        )

    @app.exception_handler(PlanError)
    async def _plan(request: Request, exc: PlanError) -> JSONResponse:
        return problem_response(
            request, 422, exc.message, slug="validation", errors=field_error(exc.field, exc.message)
        )

    @app.exception_handler(InvalidCursor)
    async def _cursor(request: Request, exc: InvalidCursor) -> JSONResponse:
        return problem_response(
            request, 400, "cursor: invalid cursor", slug="validation", errors=field_error("cursor", str(exc))
        )

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors: list[dict[str, str]] = []
        for err in exc.errors():
            if err.get("type") == "json_invalid":
                return problem_response(
                    request,
                    400,
                    "the request body is not valid JSON",
                    slug="malformed-json",
                    errors=field_error("body", str(err.get("msg", "invalid JSON"))),
                )
            field = _field_name(tuple(err.get("loc", ())))
            message = str(err.get("msg", "invalid"))
            if err.get("type") == "extra_forbidden":
                message = "unknown field"
            errors.append({"field": field, "message": message})
        detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors) or "invalid request"
        return problem_response(request, 422, detail, slug="validation", errors=errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400 and exc.detail == FASTAPI_BODY_PARSE_ERROR:
            # JSON that Python's parser gives up on (nesting too deep, an integer of more
            # than 4,300 digits): malformed like any other invalid JSON.
            return problem_response(
                request,
                400,
                "the request body is not valid JSON",
                slug="malformed-json",
                errors=field_error("body", "JSON nested too deeply or with a number too long to parse"),
            )
        headers = dict(exc.headers) if exc.headers else None
        return problem_response(request, exc.status_code, str(exc.detail), headers=headers)


class CatchAll:
    """Turns an unexpected exception into a problem response without re-raising it.

    Starlette's own handler for `Exception` answers and then re-raises, so the server logs the
    exception with its traceback and closes the connection. Here it is logged once, as our
    event, and the connection stays usable.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            request = Request(scope)
            if is_transient_db_error(exc):
                log_event(logger, "request_db_unavailable", logging.WARNING, path=request.url.path)
                response = problem_response(
                    request,
                    503,
                    "the database is unavailable; try again",
                    slug="unavailable",
                    headers={"Retry-After": "1"},
                )
            else:
                # Type and location only: driver messages can quote statement parameters
                # (asyncpg echoes a value it cannot encode), and those may be secrets.
                log_event(
                    logger,
                    "request_failed",
                    logging.ERROR,
                    path=request.url.path,
                    error=type(exc).__name__,
                    where=_where(exc),
                )
                response = problem_response(request, 500, "internal error", slug="internal")
            if not started:
                await response(scope, receive, send)


def _where(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if "/app/" in f.filename] or frames
    if not ours:
        return "unknown"
    frame = ours[-1]
    return f"{frame.filename.rsplit('/app/', 1)[-1]}:{frame.lineno} in {frame.name}"
