"""Creating jobs, with statements built once (the compiled cache always hits; a batch costs
no per-row Python SQL): INSERT ... SELECT FROM unnest(one typed array per column) for any
number of jobs, and a single-row form with plain parameters for the API's single create.

`job_insert_many` writes rows as they come (triggers, replays, tests: the caller has already
share-locked the targets). `job_create_checked` (one job) and `job_create_many_checked` (a
batch) are the API's creates: the target's share lock (a live target of the tenant) and the
tenant's `dedup_key` rule (ON CONFLICT DO NOTHING against the partial unique index) are
folded into the INSERT, so a create is one statement; a row that did not go in is explained
afterwards (no target, or the job holding its key). The single create also writes the
create's audit row in the same statement (a data-modifying CTE).
"""

from __future__ import annotations

import datetime as dt
import functools
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Select,
    Text,
    any_,
    bindparam,
    cast,
    column,
    exists,
    func,
    literal,
    literal_column,
    or_,
    select,
    text,
    true,
)
from sqlalchemy.dialects.postgresql import ARRAY, INTERVAL, JSONB, UUID, insert
from sqlalchemy.engine import RowMapping

from app.db.async_engine import AsyncConnection
from app.db.driver import DriverStatement, driver_fetch_one
from app.domain.job import NewJob
from app.domain.retry import RetryPolicy
from app.domain.schedule import OnceSchedule
from app.domain.states import TERMINAL_STATES, JobState
from app.ids import new_id
from app.store.health import target_paused_of_job
from app.store.job_rows_new import (
    ALWAYS_ARRAYS,
    COLUMN_NAMES,
    CREATED_COLUMNS,
    NEW_JOB_COLUMNS,
    PreparedJob,
    job_arrays,
    job_values,
)
from app.store.tables import DEDUP_KEY_LIVE, api_keys, audit_log, job_state, jobs, targets, tenants
from app.store.targets import target_live, target_share_lock_live

_UUID = UUID(as_uuid=True)
_TENANT_ID = bindparam("tenant_id", type_=_UUID)
_TS = jobs.c.scheduled_for.type
_INTERVAL = INTERVAL()


def _rows() -> Any:
    arrays = [bindparam(name, type_=ARRAY(type_)) for name, type_ in NEW_JOB_COLUMNS]
    names = [column(name, type_) for name, type_ in NEW_JOB_COLUMNS]
    return func.unnest(*arrays).table_valued(*names).render_derived(name="new")


def _value(new: Any, name: str) -> ColumnElement[Any]:
    """A new row's value of the column: its array's element, or the column's one value."""
    if name in ALWAYS_ARRAYS:
        return new.c[name]  # type: ignore[no-any-return]
    type_ = new.c[name].type
    return func.coalesce(new.c[name], bindparam(f"{name}_fill", type_=type_), type_=type_)


def _run_at(values: dict[str, ColumnElement[Any]]) -> ColumnElement[Any]:
    """When the new job may first be claimed: its first fire time, plus its jitter."""
    return values["scheduled_for"] + values["fire_delay_ms"] * literal_column("interval '1 millisecond'")


def _insert_select(new: Any, tenant_id: ColumnElement[Any]) -> Select[Any]:
    values: dict[str, ColumnElement[Any]] = {name: _value(new, name) for name, _ in NEW_JOB_COLUMNS}
    payload = cast(values["payload"], JSONB)
    state = cast(literal(JobState.SCHEDULED.value), job_state)
    labels = cast(values["labels"], JSONB)
    values.update(tenant_id=tenant_id, payload=payload, state=state, run_at=_run_at(values), labels=labels)
    del values["fire_delay_ms"]
    return select(*(value.label(name) for name, value in values.items()))


@functools.cache
def insert_many_statement() -> Any:
    """The INSERT of `job_insert_many`: the rows as they come, one array per column."""
    new = _rows()
    selected = _insert_select(new, _TENANT_ID).select_from(new)
    # Whether each job's target (or tenant) is paused, for the health its answer shows.
    returned = (*CREATED_COLUMNS, target_paused_of_job().label("target_paused"))
    return insert(jobs).from_select(list(selected.selected_columns.keys()), selected).returning(*returned)


def _insert_if_new(selected: Select[Any]) -> Any:
    """The INSERT of the selected rows, but not of one whose dedup_key an unfinished job of
    the tenant holds (the partial unique index)."""
    return (
        insert(jobs)
        .from_select(list(selected.selected_columns.keys()), selected)
        .on_conflict_do_nothing(index_elements=[jobs.c.tenant_id, jobs.c.dedup_key], index_where=text(DEDUP_KEY_LIVE))
    )


@functools.cache
def create_many_statement() -> Any:
    """The batch create: the rows whose target is live (share-locked by the statement),
    unless their dedup_key is held; returns the ids that went in."""
    live_ids = any_(bindparam("live_target_ids", type_=ARRAY(_UUID)))
    live = target_share_lock_live(_TENANT_ID, live_ids).cte("live_targets")
    new = _rows()
    selected = _insert_select(new, _TENANT_ID).select_from(new).where(_value(new, "target_id").in_(select(live.c.id)))
    return _insert_if_new(selected).returning(jobs.c.id)


@functools.cache
def create_one_statement(key_checked: bool) -> DriverStatement:
    """The single create with plain parameters (arrays of one cost more to encode than the
    row), for the driver (app/db/driver.py), with its audit row.
    `key_checked`: the row goes in only if the API key (by hash) is live and is the audit
    row's key of this tenant, and the database's now() comes back with it (`db_now`); a job
    planned from a delay against an earlier clock (`planned_now`) is moved on to this one."""
    live = target_share_lock_live(_TENANT_ID, bindparam("target_id", type_=_UUID))
    if key_checked:
        # In the INSERT's own snapshot: a key revoked before it started creates nothing.
        live = live.where(
            exists().where(
                api_keys.c.key_hash == bindparam("key_hash", type_=Text()),
                api_keys.c.id == bindparam("audit_api_key_id", type_=_UUID),
                api_keys.c.tenant_id == _TENANT_ID,
                api_keys.c.revoked_at.is_(None),
            )
        )
    # Whether the target (or its tenant) is paused, for the health the answer shows: the
    # target's row is read for its lock anyway, the tenant's is one look-up by key.
    tenant_paused = exists().where(tenants.c.id == _TENANT_ID, tenants.c.paused_at.is_not(None))
    live = live.add_columns(or_(targets.c.paused_at.is_not(None), tenant_paused).label("target_paused"))
    if key_checked:
        # A job planned against the clock as last seen (`planned_now`, a delay from it) is
        # moved on by how far the database's clock has gone since: due `delay_s` after this
        # statement's now(), as if planned against it. NULL for a job at a given instant.
        # In seconds: a difference of timestamptz counts whole days, and a day added to a
        # timestamptz is a calendar day of the session's TimeZone (23 or 25 h across DST).
        # Computed once, here; the fire times below add it.
        elapsed_s = func.extract("epoch", func.now() - bindparam("planned_now", type_=_TS))
        in_seconds = elapsed_s * literal_column("interval '1 second'")
        since_planned = func.coalesce(in_seconds, literal_column("interval '0'"), type_=_INTERVAL)
        live = live.add_columns(since_planned.label("since_planned"))
    live_target = live.cte("live_target")
    values: dict[str, ColumnElement[Any]] = {name: bindparam(name, type_=type_) for name, type_ in NEW_JOB_COLUMNS}
    if key_checked:
        for name in ("schedule_anchor_at", "scheduled_for"):
            values[name] = values[name] + live_target.c.since_planned
    values.update(
        tenant_id=_TENANT_ID,
        payload=cast(values["payload"], JSONB),
        labels=cast(values["labels"], JSONB),
        state=cast(literal(JobState.SCHEDULED.value), job_state),
        run_at=_run_at(values),
    )
    del values["fire_delay_ms"]
    # One row when the target is live (and then share-locked), none otherwise.
    selected = select(*(value.label(name) for name, value in values.items())).select_from(live_target)
    created = _insert_if_new(selected).returning(*CREATED_COLUMNS).cte("created")
    # The audit row of the create, written by the same statement for the row that went in
    # (none when it did not): no round trip of its own, and it commits with the job.
    audit_row = select(
        created.c.tenant_id,
        bindparam("audit_api_key_id", type_=_UUID),
        literal("api_key"),
        bindparam("audit_action", type_=Text()),
        cast(created.c.id, Text()),
        bindparam("audit_request_id", type_=Text()),
    ).select_from(created)
    audited = (
        insert(audit_log)
        .from_select(["tenant_id", "api_key_id", "actor", "action", "object_id", "request_id"], audit_row)
        .cte("audited")
    )
    columns = [*created.c, live_target.c.target_paused]
    if key_checked:
        columns.append(func.now().label("db_now"))
    answer = select(*columns).select_from(created).join(live_target, true())
    return DriverStatement(answer.add_cte(audited))


# Built once: every create hits SQLAlchemy's compiled cache and asyncpg's prepared statements.
_INSERT_MANY = insert_many_statement()
_CREATE_ONE = create_one_statement(key_checked=False)
_CREATE_ONE_FOR_KEY = create_one_statement(key_checked=True)
_CREATE_MANY = create_many_statement()
# What explains a miss (_why_not_created): the live targets among some, the holders of keys.
_LIVE_TARGETS = select(targets.c.id).where(target_live(_TENANT_ID, any_(bindparam("target_ids", type_=ARRAY(_UUID)))))
_DEDUP_HOLDERS = select(jobs.c.dedup_key, jobs.c.id).where(
    jobs.c.tenant_id == _TENANT_ID,
    jobs.c.dedup_key == any_(bindparam("dedup_keys", type_=ARRAY(Text()))),
    jobs.c.state.not_in([s.value for s in TERMINAL_STATES]),
)


async def job_insert_many(conn: AsyncConnection, batch: Sequence[PreparedJob]) -> list[RowMapping]:
    """Inserts the jobs (all of one tenant); rows come back in the order of `batch`."""
    if not batch:
        return []
    tenants = {job.new.tenant_id for job in batch}
    if len(tenants) != 1:
        raise ValueError("job_insert_many takes the jobs of one tenant")
    rows = (await conn.execute(_INSERT_MANY, job_arrays(tenants.pop(), batch))).mappings().all()
    by_id = {row["id"]: row for row in rows}
    return [by_id[job.id] for job in batch]


@dataclass(frozen=True)
class NotCreated:
    """Why a job was not created: its target is not a live target of the tenant, or an
    unfinished job of the tenant (`holder`) has its dedup_key."""

    target_missing: bool = False
    holder: uuid.UUID | None = None


# A conflicting job can finish between the INSERT and the look-up of its holder; the create
# is then tried again, at most this many times in all.
_CREATE_TRIES = 3


@dataclass(frozen=True)
class JobAudit:
    """The audit row written with an API create (app/api/audit.py)."""

    api_key_id: uuid.UUID
    request_id: str | None
    action: str


async def job_create_checked(
    conn: AsyncConnection, tenant_id: uuid.UUID, job: PreparedJob, audit: JobAudit
) -> Mapping[str, Any] | NotCreated:
    """Creates one job of the tenant and its audit row in one statement, or says why not
    (nothing written)."""
    parameters = _create_one_parameters(tenant_id, job, audit)
    for _ in range(_CREATE_TRIES):
        row = await driver_fetch_one(conn, _CREATE_ONE, parameters)
        if row is not None:
            return row
        reasons = await _why_not_created(conn, tenant_id, [job])
        if job.id in reasons:
            return reasons[job.id]
    raise RuntimeError("a job's dedup_key stayed held by a job that could not be found")


async def job_create_for_key(
    conn: AsyncConnection,
    tenant_id: uuid.UUID,
    key_hash: str,
    job: PreparedJob,
    audit: JobAudit,
    planned_now: dt.datetime | None = None,
) -> Mapping[str, Any] | None:
    """`job_create_checked` for a caller not yet authenticated by this request: the same one
    statement also checks that the key (`key_hash`, `audit.api_key_id`) is live and the
    tenant's. The row (with `db_now`, the database's clock) or None when nothing was written:
    a dead key, no such target, a held dedup_key; the caller then takes the full path, which
    says which. `planned_now`: the clock a one-off's delay was planned from; its fire time
    moves on by however far the database's clock is past it."""
    parameters = {
        **_create_one_parameters(tenant_id, job, audit),
        "key_hash": key_hash,
        "planned_now": planned_now,
    }
    return await driver_fetch_one(conn, _CREATE_ONE_FOR_KEY, parameters)


def _create_one_parameters(tenant_id: uuid.UUID, job: PreparedJob, audit: JobAudit) -> dict[str, Any]:
    """The single create's parameters: the job's columns, with a new occurrence id, and its
    audit row's."""
    return {
        "tenant_id": tenant_id,
        **dict(zip(COLUMN_NAMES, job_values(job, new_id()), strict=True)),
        "audit_api_key_id": audit.api_key_id,
        "audit_action": audit.action,
        "audit_request_id": audit.request_id,
    }


async def job_create_warm_up(conn: AsyncConnection) -> None:
    """Runs the single creates' statements (with and without the key check) once on `conn`,
    for a tenant that does not exist: nothing is written or locked. A new API process then
    answers its first creates without compiling them, and this session without preparing
    them (its first plans and the driver's type look-ups included)."""
    nobody = uuid.uuid4()
    fire = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
    new = NewJob(
        tenant_id=nobody,
        target_id=nobody,
        name=None,
        payload=None,
        priority=0,
        schedule=OnceSchedule(fire),
        first_fire_at=fire,
        policy=RetryPolicy(1, 1.0, 1.0),
    )
    job, audit = PreparedJob.of(new, "{}"), JobAudit(nobody, None, "warm-up")
    written = await driver_fetch_one(conn, _CREATE_ONE, _create_one_parameters(nobody, job, audit))
    if written is not None or await job_create_for_key(conn, nobody, "", job, audit) is not None:
        raise RuntimeError("the create's warm-up wrote a job")


async def job_create_many_checked(
    conn: AsyncConnection, tenant_id: uuid.UUID, batch: Sequence[PreparedJob]
) -> dict[uuid.UUID, NotCreated]:
    """Creates the jobs of the tenant that can be (one statement); returns, by job id, why the
    others were not. Within the batch, the first job with a dedup_key wins. Run it in a
    transaction: the caller rolls back when a target is missing."""
    not_created: dict[uuid.UUID, NotCreated] = {}
    pending = list(batch)
    for _ in range(_CREATE_TRIES):
        target_ids = list({job.new.target_id for job in pending})
        parameters = {**job_arrays(tenant_id, pending), "live_target_ids": target_ids}
        created = set((await conn.execute(_CREATE_MANY, parameters)).scalars().all())
        missed = [job for job in pending if job.id not in created]
        if not missed:
            return not_created
        reasons = await _why_not_created(conn, tenant_id, missed)
        not_created.update(reasons)
        pending = [job for job in missed if job.id not in reasons]
        if not pending:
            return not_created
    raise RuntimeError("a job's dedup_key stayed held by a job that could not be found")


async def _why_not_created(
    conn: AsyncConnection, tenant_id: uuid.UUID, missed: Sequence[PreparedJob]
) -> dict[uuid.UUID, NotCreated]:
    """For jobs the INSERT skipped: a missing target, else the holder of their dedup_key. A job
    with neither (its holder finished meanwhile) is left out: create it again."""
    target_ids = list({job.new.target_id for job in missed})
    live = set((await conn.execute(_LIVE_TARGETS, {"tenant_id": tenant_id, "target_ids": target_ids})).scalars())
    keys = list({job.new.dedup_key for job in missed if job.new.dedup_key is not None})
    holders: dict[str, uuid.UUID] = {}
    if keys:
        found = await conn.execute(_DEDUP_HOLDERS, {"tenant_id": tenant_id, "dedup_keys": keys})
        holders = {row.dedup_key: row.id for row in found}
    reasons: dict[uuid.UUID, NotCreated] = {}
    for job in missed:
        if job.new.target_id not in live:
            reasons[job.id] = NotCreated(target_missing=True)
        elif job.new.dedup_key is not None and job.new.dedup_key in holders:
            reasons[job.id] = NotCreated(holder=holders[job.new.dedup_key])
    return reasons
