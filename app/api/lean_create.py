"""`POST /v1/jobs` answered without FastAPI's per-request machinery, for the usual request.

A single create is the API's hottest request, and FastAPI's dependency solving, routing and
exception wrapping cost it more CPU than its own work (bench/README.md, "The lean create").
This ASGI middleware serves the common shape of that request itself: a bearer key, a JSON body
that JobCreate accepts, no Idempotency-Key. It runs the route's own steps (admission, key
look-up, `create_one` in app/api/routes/jobs.py) and answers errors with the app's own
exception handlers, so a client cannot tell the two paths apart.

A key this process has authenticated before (KnownKeys) skips the look-up's round trip: for
a job at a given instant, one INSERT checks the key and writes the job and its audit row
(`create_for_known_key`). Whatever that does not write (a revoked key, a refusal) is then
answered by the full steps, which check the key first, as the route does.

Anything else (another header set, a body FastAPI would refuse, a throttled address) goes to
the FastAPI route untouched, with its body replayed, before this path has had any effect: the
route stays the reference and the published contract (OpenAPI). The point of no return is the
request-rate admission, which counts the request.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from app.api.deps import admit_key, authenticate, client_address
from app.api.errors import Problem
from app.api.idempotency import HEADER as IDEMPOTENCY_HEADER
from app.api.routes.jobs import create_for_known_key, create_one
from app.api.schemas.jobs import JobCreate, JobPublic
from app.db.watch import DB_WATCH
from app.logs import REQUEST_ID
from app.store.tenants import Caller as KeyMatch
from app.store.tenants import hash_api_key

PATH = "/v1/jobs"
_IDEMPOTENCY = IDEMPOTENCY_HEADER.lower().encode()
_JSON = b"application/json"


@dataclass(frozen=True)
class _RouteName:
    """What app/api/observability.py reads of `scope["route"]`: the template, for metrics and
    the access line (the same as the FastAPI route's)."""

    path: str


_ROUTE = _RouteName(PATH)
# Where BodySizeLimit (app/api/app.py, outside this middleware) leaves the body it read: the
# lean path takes it from there, and the route gets it replayed as usual.
BODY_KEY = "cronhook.body"


def _plain_request(scope: Scope) -> str | None:
    """The bearer key of a request this path serves, else None."""
    authorization = content_type = None
    for name, value in scope["headers"]:
        if name == b"authorization":
            if authorization is not None:
                return None
            authorization = value
        elif name == b"content-type":
            if content_type is not None:
                return None  # FastAPI reads the first; rare enough to leave to the route
            content_type = value
        elif name == _IDEMPOTENCY:
            return None
    if authorization is None or content_type is None:
        return None
    if content_type.split(b";", 1)[0].strip().lower() != _JSON:
        return None
    # As FastAPI's HTTPBearer reads the header (fastapi.security.utils): Starlette decodes it
    # as latin-1, the credentials follow the first space, stripped.
    header: str = authorization.decode("latin-1")
    scheme, _, key = header.partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key:
        return None
    return key


def _body_model(body: bytes) -> JobCreate | None:
    """The body as the route would validate it (json.loads, then the model), or None when the
    route would answer 4xx: FastAPI words that answer."""
    if not body:
        return None
    try:
        return JobCreate.model_validate(json.loads(body))
    except (ValueError, RecursionError, ValidationError):
        # ValueError covers JSONDecodeError and Unicode errors.
        return None


class LeanCreate:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.known_keys = KnownKeys()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != PATH:
            await self.app(scope, receive, send)
            return
        key = _plain_request(scope)
        if key is None:
            await self.app(scope, receive, send)
            return
        body = scope.get(BODY_KEY)
        fastapi: FastAPI = scope["app"]
        state = fastapi.state
        address = client_address(scope)
        model = None if body is None else _body_model(body)
        if model is None or state.quotas.auth_wait(address) is not None:
            await self.app(scope, receive, send)
            return
        scope["route"] = _ROUTE
        try:
            response = await self._create(address, key, model, state)
        except Exception as exc:
            handler = _handler_for(fastapi, exc)
            if handler is None:
                raise
            response = await handler(Request(scope, receive), exc)
        await response(scope, receive, send)

    async def _create(self, address: str, key: str, model: JobCreate, state: Any) -> Response:
        quotas = state.quotas
        await admit_key(quotas, key)
        key_hash = hash_api_key(key)
        request_id = REQUEST_ID.get()
        # As the route's CreateConn: autocommit, and the connection is back in the pool before
        # the response is sent.
        with DB_WATCH.operation("api_create"):
            async with state.engine.connect() as conn:
                await conn.execution_options(isolation_level="AUTOCOMMIT")
                known = self.known_keys.caller(key_hash)
                if known is not None:
                    created = await create_for_known_key(
                        conn, known, key_hash, model, state.settings, quotas, request_id
                    )
                    if created is not None:
                        job, now = created
                        self.known_keys.saw(now)
                        return _created(job)
                try:
                    creator = await authenticate(address, conn, key, quotas)
                except Problem:
                    self.known_keys.forget(key_hash)
                    raise
                self.known_keys.remember(key_hash, creator)
                job = await create_one(conn, creator, model, state.settings, quotas, request_id)
        return _created(job)


def _created(job: JobPublic) -> Response:
    return Response(job.model_dump_json(), status_code=201, media_type="application/json")


class KnownKeys:
    """The keys this process has authenticated, by hash: their tenant and key id, which never
    change for a key. Not an authentication cache: a create for a known key goes in one
    statement that checks the key again (app/api/routes/jobs.py, create_for_known_key), which
    spares the look-up's round trip. Also the database's clock as last seen (`now`), which
    only moves forward here.

    Bounded: past MAX_KEYS the oldest entry is dropped (a key then takes the full path once)."""

    MAX_KEYS = 10_000

    def __init__(self) -> None:
        self._keys: dict[str, tuple[uuid.UUID, uuid.UUID]] = {}
        self.now: dt.datetime | None = None

    def caller(self, key_hash: str) -> KeyMatch | None:
        """The key's tenant and id, with the clock as last seen; None for a key not known yet
        (or before any clock was seen)."""
        found = self._keys.get(key_hash)
        if found is None or self.now is None:
            return None
        return KeyMatch(found[0], found[1], self.now)

    def remember(self, key_hash: str, caller: KeyMatch) -> None:
        if key_hash not in self._keys and len(self._keys) >= self.MAX_KEYS:
            del self._keys[next(iter(self._keys))]
        self._keys[key_hash] = (caller.tenant_id, caller.api_key_id)
        self.saw(caller.now)

    def forget(self, key_hash: str) -> None:
        self._keys.pop(key_hash, None)

    def saw(self, now: dt.datetime) -> None:
        if self.now is None or now > self.now:
            self.now = now


def _handler_for(app: FastAPI, exc: Exception) -> Any:
    """The app's handler for this exception (Problem, ScheduleError, PlanError...), as
    Starlette's ExceptionMiddleware would choose it (all of them are coroutines: see
    install_error_handlers); None for the unexpected, which CatchAll (app/api/errors.py)
    answers."""
    for cls in type(exc).__mro__:
        if cls is Exception:
            return None
        handler = app.exception_handlers.get(cls)
        if handler is not None:
            return handler
    return None
