"""Named schedules: `PUT /v1/schedules/{key}` makes the tenant's job known by `key` match the
request's definition, idempotently.

The request is planned as a create would be (defaults applied, hashed cron values resolved
from the job's own id) and compared, field by field, with the job the key names:
- none yet: the job is created with the key (201);
- nothing differs: nothing is written, so the job keeps its occurrence, next_run_at and runs
  (200, `changed` empty);
- else the differing fields are changed as a PATCH changes them (200, `changed` names them):
  a new schedule recomputes the next fire time, a payload or policy keeps it.

Every answer carries the definition's ETag; `If-Match` (the job must have that ETag) and
`If-None-Match: *` (only if the key names no job) make a PUT conditional (412 otherwise).
Concurrent PUTs of one key are serialised on the key (app/store/schedule_keys.py).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import RowMapping

from app.api.chains import lock_parent
from app.api.errors import Problem
from app.api.job_changes import change_job
from app.api.job_creates import create_prepared, planned_job
from app.api.quotas import Quotas
from app.api.schemas.jobs import JobCreate, JobUpdate
from app.db.async_engine import AsyncConnection
from app.domain.job import NewJob
from app.domain.job_plan import RECURRENCE_FIELDS, PlanError
from app.domain.schedule import CronSchedule, IntervalSchedule, OnceSchedule
from app.settings import Settings
from app.store.chains import job_mark_fires_children
from app.store.job_inserts import JobAudit
from app.store.schedule_keys import job_lock_by_key, job_set_key
from app.store.tenants import Caller

KEY_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,199}$"
_KEY = re.compile(KEY_PATTERN)
# GET /v1/schedules/preview answers a preview, so no schedule may be named so.
RESERVED_KEYS = frozenset({"preview"})
# The audit action of a PUT (the create statement writes it for a new schedule).
PUT_SCHEDULE = "putSchedule"

# A recurring definition's policies and bounds (a create's own names for them).
_RECURRENCE = RECURRENCE_FIELDS


def check_key(key: str) -> None:
    if not _KEY.fullmatch(key):  # not .match: `$` matches before a final newline
        raise Problem(
            422, "must match [a-z0-9][a-z0-9._-]{0,199}: lower-case letters, digits, '.', '_', '-'", field="key"
        )
    if key in RESERVED_KEYS:
        raise Problem(422, f"{key!r} is reserved", slug="validation", field="key")


@dataclass(frozen=True)
class Upserted:
    row: RowMapping
    created: bool
    # The definition's fields that changed (all of them for a new job), as the API names them.
    changed: list[str]


def row_definition(row: Any) -> dict[str, Any]:
    """The job's definition, as a PUT states it: what it does and when, not its progress."""
    kind = str(row["schedule_kind"])
    definition: dict[str, Any] = {
        "target_id": row["target_id"],
        "name": row["name"],
        "payload": row["payload"],
        "priority": row["priority"],
        "schedule_kind": kind,
        "cron": row["cron_source"] or row["cron"],
        "timezone": row["timezone"] if kind == "cron" else None,
        "every_s": row["every_s"],
        "run_at": row["scheduled_for"] if kind == "once" else None,
        "max_attempts": row["max_attempts"],
        "backoff_base_s": row["backoff_base_s"],
        "backoff_max_s": row["backoff_max_s"],
        "backoff_factor": row["backoff_factor"],
        "completion": row["completion"],
        "async_timeout_s": row["async_timeout_s"],
        "heartbeat_timeout_s": row["heartbeat_timeout_s"],
        "after": None if row["after_job_id"] is None else {"job_id": row["after_job_id"], "on": row["after_on"]},
        "payload_from": row["payload_from"],
        "labels": row["labels"] or None,
    }
    if kind in ("cron", "interval"):
        definition.update({name: _plain(row[name]) for name in _RECURRENCE})
        if kind != "interval":
            definition["interval_mode"] = None
    expect = _expect(row["expect_success_within_s"], row["expect_max_consecutive_failures"])
    return definition | _health_fields(expect, row["on_success_target_id"], row["on_failure_target_id"])


def _expect(success_within_s: int | None, max_consecutive_failures: int | None) -> dict[str, Any] | None:
    if success_within_s is None and max_consecutive_failures is None:
        return None
    return {"success_within_s": success_within_s, "max_consecutive_failures": max_consecutive_failures}


def _health_fields(
    expect: dict[str, Any] | None, on_success: uuid.UUID | None, on_failure: uuid.UUID | None
) -> dict[str, Any]:
    """A definition's `expect` and callback targets, those set only: a definition that sets
    none keeps the ETag it had before they existed."""
    fields = {"expect": expect, "on_success_target_id": on_success, "on_failure_target_id": on_failure}
    return {name: value for name, value in fields.items() if value is not None}


def schedule_definition(row: Any) -> dict[str, Any]:
    """A named schedule as a PUT states it: its key and set, and its definition's fields that
    are set (JSON-ready: ids and instants as text)."""
    definition = {name: _json(value) for name, value in row_definition(row).items() if value is not None}
    kind = definition.pop("schedule_kind")
    if kind == "once":
        definition.pop("timezone", None)
    if "after" in definition:
        definition["after"] = {name: _json(value) for name, value in definition["after"].items()}
    if "payload" not in definition:
        definition["payload"] = None
    return {"key": row["schedule_key"], "set": row["schedule_set"], **definition}


def new_definition(new: NewJob) -> dict[str, Any]:
    """A planned job's definition (row_definition's fields)."""
    schedule = new.schedule
    kind = "after" if new.after is not None else type(schedule).__name__.removesuffix("Schedule").lower()
    completion = new.completion
    definition: dict[str, Any] = {
        "target_id": new.target_id,
        "name": new.name,
        "payload": new.payload,
        "priority": new.priority,
        "schedule_kind": kind,
        "cron": schedule.written if isinstance(schedule, CronSchedule) else None,
        "timezone": schedule.timezone if isinstance(schedule, CronSchedule) else None,
        "every_s": schedule.every_s if isinstance(schedule, IntervalSchedule) else None,
        "run_at": new.first_fire_at if kind == "once" else None,
        "max_attempts": new.policy.max_attempts,
        "backoff_base_s": new.policy.backoff_base_s,
        "backoff_max_s": new.policy.backoff_max_s,
        "backoff_factor": new.policy.backoff_factor,
        "completion": None if completion is None else completion.mode,
        "async_timeout_s": None if completion is None else completion.async_timeout_s,
        "heartbeat_timeout_s": None if completion is None else completion.heartbeat_timeout_s,
        "after": None if new.after is None else {"job_id": new.after.parent_id, "on": new.after.on.value},
        "payload_from": None if new.after is None else new.after.payload_from,
        "labels": new.labels or None,
    }
    rec = new.recurrence
    if rec is not None:
        definition.update(
            interval_mode=rec.interval_mode.value if isinstance(schedule, IntervalSchedule) else None,
            misfire_policy=rec.misfire_policy.value,
            misfire_grace_s=rec.misfire_grace_s,
            catch_up_limit=rec.catch_up_limit,
            overlap_policy=rec.overlap_policy.value,
            jitter_s=rec.jitter_s,
            start_at=rec.bounds.start_at,
            end_at=rec.bounds.end_at,
            max_runs=rec.bounds.max_runs,
        )
    expect = None if new.expect is None else _expect(new.expect.success_within_s, new.expect.max_consecutive_failures)
    return definition | _health_fields(expect, new.on_success_target_id, new.on_failure_target_id)


def _plain(value: Any) -> Any:
    return getattr(value, "value", value)


def _json(value: Any) -> Any:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC).isoformat()
    return value


def etag(row: Any) -> str:
    """The definition's strong ETag: changes with what the job does or when, not with its runs."""
    canonical = json.dumps(row_definition(row), default=_json, sort_keys=True, separators=(",", ":"))
    return '"' + hashlib.sha256(canonical.encode()).hexdigest()[:32] + '"'


def refuse_delay(body: JobCreate) -> None:
    if "delay_s" in body.model_fields_set and body.delay_s is not None:
        raise PlanError("delay_s", "a schedule is stated, not counted from now: give run_at, cron or every_s")


def definition_changes(row: Any, new: NewJob, body: JobCreate) -> list[str]:
    """The definition's fields that differ between the job `row` and the planned `new` (the
    body's, with defaults); PlanError for a change a PUT cannot make: a new dedup_key, a
    chained job turning into a scheduled one or back."""
    if "dedup_key" in body.model_fields_set and body.dedup_key != row["dedup_key"]:
        raise PlanError("dedup_key", "a job's dedup_key is set when it is created")
    current, desired = row_definition(row), new_definition(new)
    changed = sorted(name for name in desired.keys() | current.keys() if current.get(name) != desired.get(name))
    if "schedule_kind" in changed and (row["schedule_kind"] == "after" or new.after is not None):
        raise PlanError(
            "after",
            "a chained job and a scheduled one do not turn into each other: delete the schedule and put it again",
        )
    return changed


def shown_changes(changed: list[str]) -> list[str]:
    """`changed` as answered: the schedule's fields, not its kind (unless that is all)."""
    return [name for name in changed if name != "schedule_kind"] or changed


def update_of(new: NewJob, changed: list[str], body: JobCreate) -> JobUpdate:
    """The PATCH that makes the job's definition `new`: each changed field with its planned
    value (a default spelled out, so it replaces what the job had)."""
    desired = new_definition(new)
    values: dict[str, Any] = {}
    for name in changed:
        if name == "schedule_kind" or name in ("cron", "timezone", "every_s", "run_at"):
            schedule = new.schedule
            if isinstance(schedule, CronSchedule):
                values.update(cron=schedule.written, timezone=schedule.timezone)
            elif isinstance(schedule, IntervalSchedule):
                values["every_s"] = schedule.every_s
            elif isinstance(schedule, OnceSchedule) and new.after is None:
                values["run_at"] = new.first_fire_at
        elif name in _RECURRENCE:
            if new.recurrence is not None and (name != "interval_mode" or desired[name] is not None):
                values[name] = desired[name]
        elif name == "after":
            if new.after is not None:
                values["after"] = {"job_id": new.after.parent_id, "on": new.after.on.value}
        elif name == "payload":
            values["payload"] = body.payload
        else:
            # expect and the callback targets are absent when unset: null removes them.
            values[name] = desired.get(name)
    return JobUpdate.model_validate(values)


async def put_schedule(
    conn: AsyncConnection,
    caller: Caller,
    key: str,
    body: JobCreate,
    settings: Settings,
    quotas: Quotas,
    preconditions: tuple[str | None, str | None],
    request_id: str | None,
) -> Upserted:
    """Creates or changes the job `key` names (module docstring), in the request's transaction."""
    check_key(key)
    refuse_delay(body)
    if_match, if_none_match = preconditions
    tenant_id = caller.tenant_id
    row = await job_lock_by_key(conn, tenant_id, key)
    if row is None:
        if if_match is not None:
            raise Problem(412, f"no schedule is named {key!r} (If-Match)", slug="precondition-failed")
        prepared = await planned_job(conn, caller, body, settings, quotas)
        if prepared.new.after is not None:
            await lock_parent(conn, tenant_id, prepared.new.after.parent_id)
        created = await create_prepared(
            conn, tenant_id, prepared, JobAudit(caller.api_key_id, request_id, PUT_SCHEDULE)
        )
        if prepared.new.after is not None:
            await job_mark_fires_children(conn, tenant_id, prepared.new.after.parent_id)
        named = await job_set_key(conn, created["id"], key)
        return Upserted(named, True, sorted(k for k, v in new_definition(prepared.new).items() if v is not None))
    if if_none_match == "*":
        raise Problem(412, f"a schedule is already named {key!r} (If-None-Match: *)", slug="precondition-failed")
    if if_match is not None and if_match != etag(row):
        raise Problem(412, "the schedule has changed since that ETag (If-Match)", slug="precondition-failed")
    desired = (await planned_job(conn, caller, body, settings, quotas, job_id=row["id"])).new
    changed = definition_changes(row, desired, body)
    if not changed:
        return Upserted(row, False, [])
    updated = await change_job(conn, tenant_id, row, update_of(desired, changed, body), settings, quotas)
    return Upserted(updated, False, shown_changes(changed))
