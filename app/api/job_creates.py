"""Creating jobs: the one use case behind `POST /v1/jobs` and `POST /v1/jobs/batch`.

A create plans each job against the database's clock (app/domain/job_plan.py), holds it to the
payload limit and the tenant's quotas, and writes it with its audit row in one statement
(app/store/job_inserts.py). What was not created is answered by one builder
(`not_created_problem`): an unknown target (422) or a dedup_key an unfinished job holds (409),
named by field, with `jobs[i].` before it in a batch.

The usual single create (a bearer key, a JSON body, no Idempotency-Key) is the API's hottest
request. `QuickCreate` answers it as a branch of this use case, from the route's own handler
(app/api/routes/jobs.py, JobCreateRoute: FastAPI's public hook for a custom route class),
skipping FastAPI's dependency solving; anything else, and any request it declines before it has
had an effect, goes to the route's full handler, which stays the reference and the published
contract. tests/integration/test_quick_create.py holds the two to the same answers.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response

from app.api.chains import create_chained
from app.api.checks import ensure_payload_fits
from app.api.deps import admit_key, authenticate, client_address, fresh_connection
from app.api.errors import Problem, problem_item
from app.api.idempotency import HEADER as IDEMPOTENCY_HEADER
from app.api.quota_checks import check_job_within_limits, ensure_job_within_quotas, ensure_room_for_jobs
from app.api.quotas import Quotas
from app.api.schemas.jobs import JobCreate, JobPublic, job_public
from app.db.async_engine import AsyncConnection
from app.db.errors import is_transient_db_error
from app.db.watch import DB_WATCH
from app.domain.job import NewJob
from app.domain.job_plan import CALLBACK_FIELDS, PlanError, plan_create
from app.domain.schedule import ScheduleError
from app.ids import new_ids
from app.logs import REQUEST_ID
from app.settings import Settings
from app.store import jobs as store
from app.store.job_inserts import JobAudit, NotCreated, job_create_checked, job_create_for_key, job_create_many_checked
from app.store.job_rows_new import PreparedJob
from app.store.targets import target_lock_live_many
from app.store.tenants import Caller, hash_api_key

CREATE_JOB = "createJob"


def not_created_problem(reason: NotCreated, field_prefix: str = "") -> Problem:
    """Why a job was not written, as the client is told (`field_prefix`: `jobs[i].` in a batch)."""
    if reason.holder is None:
        # Unknown and foreign targets look the same: a tenant learns nothing of others' ids.
        return Problem(422, "no such target", slug="validation", field=f"{field_prefix}target_id")
    return Problem(
        409,
        f"an unfinished job already has this dedup_key: {reason.holder}",
        slug="duplicate-job",
        field=f"{field_prefix}dedup_key",
        extra={"job_id": str(reason.holder)},
    )


async def create_one(
    conn: AsyncConnection, creator: Caller, body: JobCreate, settings: Settings, quotas: Quotas, request_id: str | None
) -> JobPublic:
    """A single create, after authentication (the route's, and the quick branch's for a key
    not known yet)."""
    prepared = await planned_job(conn, creator, body, settings, quotas)
    audit = _create_audit(creator, request_id)
    if prepared.new.after is not None:
        created = await create_chained(conn, creator.tenant_id, prepared, audit)
    else:
        # The audit row is written by the same INSERT statement as the job (a data-modifying
        # CTE): one round trip, and in autocommit the job and its audit row commit together.
        created = await job_create_checked(conn, creator.tenant_id, prepared, audit)
    if isinstance(created, NotCreated):
        raise not_created_problem(created)
    return job_public(created)


async def planned_job(
    conn: AsyncConnection,
    caller: Caller,
    body: JobCreate,
    settings: Settings,
    quotas: Quotas,
    job_id: uuid.UUID | None = None,
) -> PreparedJob:
    """The job a create request makes, within the payload limit and the tenant's quotas, planned
    against `caller.now`. With `job_id`: the definition an existing job is to have (a named
    schedule's PUT), checked against the tenant's limits but not counted again."""
    payload = ensure_payload_fits(body.payload, settings)
    new = plan_create(body, caller.tenant_id, settings.default_retry_policy, caller.now, job_id)
    await ensure_callback_targets(conn, caller.tenant_id, [("", new)])
    # Quotas: the tenant's limits and unfinished-job count are cached (app/api/quotas.py), so
    # this costs a round trip only when the cache lapses.
    await ensure_job_within_quotas(
        conn, quotas, caller.tenant_id, new.schedule, new.policy, caller.now, new_jobs=0 if job_id else 1
    )
    return PreparedJob.of(new, payload, job_id)


async def ensure_callback_targets(
    conn: AsyncConnection, tenant_id: uuid.UUID, planned: Sequence[tuple[str, NewJob]]
) -> None:
    """Each job's callback targets (on_success_target_id, on_failure_target_id) are live
    targets of the tenant: else a 422 naming the field (after its prefix, `jobs[i].` in a
    batch). A look-up only when some job has one: most creates have none."""
    wanted = {getattr(new, field) for _, new in planned for field in CALLBACK_FIELDS} - {None}
    if not wanted:
        return
    live = await target_lock_live_many(conn, tenant_id, wanted)
    for prefix, new in planned:
        for field in CALLBACK_FIELDS:
            if getattr(new, field) not in (None, *live):
                raise Problem(422, "no such target", slug="validation", field=f"{prefix}{field}")


async def create_prepared(
    conn: AsyncConnection, tenant_id: uuid.UUID, prepared: PreparedJob, audit: JobAudit
) -> Mapping[str, Any]:
    """The job and its audit row, in the caller's transaction; the problem when it was not
    written (nothing was)."""
    created = await job_create_checked(conn, tenant_id, prepared, audit)
    if isinstance(created, NotCreated):
        raise not_created_problem(created)
    return created


def _create_audit(caller: Caller, request_id: str | None) -> JobAudit:
    return JobAudit(api_key_id=caller.api_key_id, request_id=request_id, action=CREATE_JOB)


async def create_for_known_key(
    conn: AsyncConnection,
    known: Caller,
    key_hash: str,
    body: JobCreate,
    settings: Settings,
    quotas: Quotas,
    request_id: str | None,
) -> tuple[JobPublic, dt.datetime] | None:
    """create_one in one round trip, for a key this process has authenticated before: the
    INSERT checks the key itself, in its own snapshot, so a revoked key creates nothing. Returns
    the job and the database's now(), or None when nothing was written (a dead key, a refusal
    of any kind): create_one, after a key look-up, then answers as it always does.

    A job at a given instant (`run_at`): planning it reads the clock only to bound the
    instant ahead, and `known.now` (the database's now() as this process last saw it) is
    earlier than the database's: an instant it accepts, the true clock accepts too. A one-off
    after a delay (`delay_s`): planned from `known.now`, every bound it meets is relative to
    the clock, and the INSERT moves its fire time on to its own now() (due `delay_s` after
    it, as the full path plans it from the look-up's now()). A recurring schedule is planned
    from the clock itself: create_one."""
    if body.run_at is None and body.delay_s is None:
        return None
    tenant_id = known.tenant_id
    try:
        prepared = await planned_job(conn, known, body, settings, quotas)
    except (Problem, ScheduleError, PlanError):
        return None  # answered by create_one, after the key is checked (a revoked key is a 401)
    except Exception as exc:
        # The quotas' cache lapsed, and their read was the first statement on a pooled
        # connection that had died: create_one's key look-up retries on a fresh one.
        if not is_transient_db_error(exc):
            raise
        await fresh_connection(conn)
        return None
    try:
        audit = _create_audit(known, request_id)
        planned_now = None if body.delay_s is None else known.now
        row = await job_create_for_key(conn, tenant_id, key_hash, prepared, audit, planned_now)
    except Exception as exc:
        if not is_transient_db_error(exc):
            raise
        # The INSERT is the request's first statement, on a pooled connection that may have
        # died (a restarted database). In autocommit it may also have committed just before:
        # the job's id is ours, so look for it on a fresh connection.
        await fresh_connection(conn)
        found = await store.job_get(conn, tenant_id, prepared.id)
        row = None if found is None else {**found, "db_now": known.now}
    if row is None:
        quotas.jobs_created(tenant_id, -1)  # counted by ensure_job_within_quotas; create_one counts again
        return None
    return job_public(row), row["db_now"]


@dataclass(frozen=True)
class BatchCreated:
    """A batch's answer: 201 when every item was created, 207 when some were not."""

    status: int
    body: dict[str, Any]


def _item_field(refused: Exception, index: int) -> Exception:
    """A refusal of one item, its field named `jobs[index].field`."""
    if isinstance(refused, ScheduleError):
        return ScheduleError(f"jobs[{index}].{refused.field}", refused.message)
    if isinstance(refused, PlanError):
        return PlanError(f"jobs[{index}].{refused.field}", refused.message)
    if isinstance(refused, Problem) and refused.field is not None:
        refused.field = f"jobs[{index}].{refused.field}"
    return refused


async def create_batch(
    conn: AsyncConnection, caller: Caller, items: Sequence[JobCreate], settings: Settings, quotas: Quotas
) -> BatchCreated:
    """Many creates in the request's transaction and (nearly) one INSERT. All or nothing for
    input (every item planned before anything is written; a bad item or an unknown target
    refuses the batch, naming `jobs[i].field`); dedup_key conflicts are per item."""
    tenant_id = caller.tenant_id
    defaults = settings.default_retry_policy
    # Each job against the tenant's floors (schedule, retry policy); the count below.
    limits = await quotas.limits(conn, tenant_id)
    batch: list[PreparedJob] = []
    for index, (item, job_id) in enumerate(zip(items, new_ids(len(items)), strict=True)):
        try:
            if item.after is not None:
                raise PlanError("after", "create chained jobs one at a time (POST /v1/jobs)")
            payload = ensure_payload_fits(item.payload, settings)
            new = plan_create(item, tenant_id, defaults, caller.now, job_id)
            check_job_within_limits(limits, new.schedule, new.policy, caller.now)
        except (ScheduleError, PlanError, Problem) as refused:
            raise _item_field(refused, index) from None
        batch.append(PreparedJob.of(new, payload, job_id))
    await ensure_callback_targets(conn, tenant_id, [(f"jobs[{index}].", job.new) for index, job in enumerate(batch)])
    await ensure_room_for_jobs(conn, quotas, tenant_id, new_jobs=len(batch))
    live = await target_lock_live_many(conn, tenant_id, {job.new.target_id for job in batch})
    for index, job in enumerate(batch):
        if job.new.target_id not in live:
            raise not_created_problem(NotCreated(target_missing=True), f"jobs[{index}].")
    not_created = await job_create_many_checked(conn, tenant_id, batch)
    results: list[dict[str, Any]] = []
    for index, job in enumerate(batch):
        reason = not_created.get(job.id) if not_created else None  # a UUID's hash is Python code
        if reason is None:
            due = job.new.first_fire_at.isoformat().replace("+00:00", "Z")
            results.append({"index": index, "status": 201, "id": str(job.id), "next_run_at": due, "problem": None})
            continue
        if reason.holder is None:  # the targets are share-locked: they cannot have gone
            raise RuntimeError("a locked target disappeared during a batch create")
        problem = problem_item(not_created_problem(reason, f"jobs[{index}]."))
        results.append({"index": index, "status": 409, "id": None, "next_run_at": None, "problem": problem})
    body = {"created": len(batch) - len(not_created), "conflicts": len(not_created), "items": results}
    return BatchCreated(207 if not_created else 201, body)


_JSON = "application/json"


class QuickCreate:
    """The usual single create, answered without FastAPI's dependency solving: the same steps
    as the route's dependencies and body (admission, key look-up, create_one), in the same
    order. `answer` returns None, having had no effect, for a request it leaves to the route:
    another header set, a body the route would refuse, a throttled address. The point of no
    return is the request-rate admission, which counts the request.

    A key this process has authenticated before (KnownKeys) skips the look-up's round trip:
    for a one-off job (at an instant or after a delay), one INSERT checks the key and writes
    the job and its audit row (create_for_known_key)."""

    def __init__(self) -> None:
        self.known_keys = KnownKeys()

    async def answer(self, request: Request) -> Response | None:
        headers = request.headers
        if IDEMPOTENCY_HEADER in headers:
            return None
        content_type = headers.get("content-type")
        if content_type is None or content_type.partition(";")[0].strip().lower() != _JSON:
            return None
        key = _bearer_key(headers.get("authorization"))
        if key is None:
            return None
        body = await request.body()  # replayed to the route if it declines (Request caches it)
        model = _body_model(body)
        state = request.app.state
        address = client_address(request.scope)
        if model is None or state.quotas.auth_wait(address) is not None:
            return None
        job = await self._create(address, key, model, state)
        # Serialised here: the model was validated when built, FastAPI would validate it again.
        return Response(job.model_dump_json(), status_code=201, media_type=_JSON)

    async def _create(self, address: str, key: str, model: JobCreate, state: Any) -> JobPublic:
        quotas: Quotas = state.quotas
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
                        return job
                try:
                    creator = await authenticate(address, conn, key, quotas)
                except Problem:
                    self.known_keys.forget(key_hash)
                    raise
                self.known_keys.remember(key_hash, creator)
                return await create_one(conn, creator, model, state.settings, quotas, request_id)


def _bearer_key(authorization: str | None) -> str | None:
    """The key as FastAPI's HTTPBearer reads the header (the credentials follow the first space,
    stripped); None where the route would answer 401 itself."""
    if authorization is None:
        return None
    scheme, _, key = authorization.partition(" ")
    key = key.strip()
    return key if scheme.lower() == "bearer" and key else None


def _body_model(body: bytes) -> JobCreate | None:
    """The body as the route would validate it (json.loads, then the model), or None when the
    route would answer 4xx: FastAPI words that answer."""
    if not body:
        return None
    try:
        model = JobCreate.model_validate(json.loads(body))
    except (ValueError, RecursionError, ValidationError):
        # ValueError covers JSONDecodeError and Unicode errors.
        return None
    # A chained job takes its parent's lock in a transaction: the route's path.
    return None if model.after is not None else model


class KnownKeys:
    """The keys this process has authenticated, by hash: their tenant and key id, which never
    change for a key. Not an authentication cache: a create for a known key goes in one
    statement that checks the key again (create_for_known_key), which spares the look-up's
    round trip. Also the database's clock as last seen (`now`), which only moves forward here.

    Bounded: past MAX_KEYS the oldest entry is dropped (a key then takes the full path once)."""

    MAX_KEYS = 10_000

    def __init__(self) -> None:
        self._keys: dict[str, tuple[uuid.UUID, uuid.UUID]] = {}
        self.now: dt.datetime | None = None

    def caller(self, key_hash: str) -> Caller | None:
        """The key's tenant and id, with the clock as last seen; None for a key not known yet
        (or before any clock was seen)."""
        found = self._keys.get(key_hash)
        if found is None or self.now is None:
            return None
        return Caller(found[0], found[1], self.now)

    def remember(self, key_hash: str, caller: Caller) -> None:
        if key_hash not in self._keys and len(self._keys) >= self.MAX_KEYS:
            del self._keys[next(iter(self._keys))]
        self._keys[key_hash] = (caller.tenant_id, caller.api_key_id)
        self.saw(caller.now)

    def forget(self, key_hash: str) -> None:
        self._keys.pop(key_hash, None)

    def saw(self, now: dt.datetime) -> None:
        if self.now is None or now > self.now:
            self.now = now
