"""Changing a waiting job (PATCH, and the named schedules' PUT): what the request sets, planned
against the job's row (app/domain/job_updates.py) and written in one UPDATE guarded by its state.
The caller holds the row's lock."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy.engine import RowMapping

from app.api.chains import lock_parent
from app.api.checks import ensure_payload_fits, require_live_target
from app.api.errors import Problem
from app.api.quota_checks import ensure_job_within_quotas
from app.api.quotas import Quotas
from app.api.schemas.jobs import JobUpdate
from app.db.async_engine import AsyncConnection
from app.domain.chains import ChainOn
from app.domain.job_plan import CALLBACK_FIELDS, COMPLETION_FIELDS, RECURRENCE_FIELDS, SCHEDULE_FIELDS, plan_expect
from app.domain.job_updates import Rescheduled, plan_update
from app.domain.schedule import ScheduleKind, hash_seed
from app.domain.states import CHANGEABLE_STATES, TERMINAL_STATES, JobState
from app.settings import Settings
from app.store import jobs as store
from app.store.chains import job_mark_fires_children
from app.store.job_rows import job_change_columns, policy_from_row, recurrence_from_row, schedule_from_row
from app.store.targets import target_lock_live


def state_conflict(row: RowMapping, action: str) -> Problem:
    state: JobState = row["state"]
    if state == JobState.RUNNING:
        detail = f"cannot {action} while an occurrence is being delivered; retry when it finishes"
        slug = "job-running"
    elif state in TERMINAL_STATES:
        detail, slug = f"cannot {action} a job that is already {state.value}", "job-finished"
    else:
        detail, slug = f"cannot {action} a job that is {state.value}", "job-state"
    return Problem(409, detail, slug=slug, extra={"state": state.value})


async def _chain_changes(
    conn: AsyncConnection, tenant_id: uuid.UUID, row: RowMapping, body: JobUpdate
) -> dict[str, Any]:
    """What a PATCH changes of a chained job's link (after, payload_from). A chained job takes
    no schedule, and a scheduled job does not become a chained one (create one instead)."""
    given = body.model_fields_set
    chained = row["schedule_kind"] == ScheduleKind.AFTER
    if not chained:
        for name in ("after", "payload_from"):
            if name in given:
                raise Problem(
                    422, "applies only to a chained job: create one with after", slug="validation", field=name
                )
        return {}
    for name in (*sorted(SCHEDULE_FIELDS), *RECURRENCE_FIELDS):
        if name in given:
            raise Problem(
                422, "a chained job runs when its parent settles: it takes no schedule", slug="validation", field=name
            )
    changes: dict[str, Any] = {}
    if "after" in given:
        if body.after is None:
            raise Problem(422, "a chained job needs its parent: cancel it instead", slug="validation", field="after")
        if body.after.job_id != row["after_job_id"]:
            await lock_parent(conn, tenant_id, body.after.job_id, child_id=row["id"])
            await job_mark_fires_children(conn, tenant_id, body.after.job_id)
        changes.update(after_job_id=body.after.job_id, after_on=(body.after.on or ChainOn.SUCCESS).value)
    if "payload_from" in given:
        changes["payload_from"] = body.payload_from
    return changes


async def _health_changes(
    conn: AsyncConnection, tenant_id: uuid.UUID, row: RowMapping, body: JobUpdate, rescheduled: Rescheduled | None
) -> dict[str, Any]:
    """What a PATCH changes of the job's health thresholds (`expect`, recurring jobs only: a
    job that becomes a one-off drops them) and callback targets (live targets of the tenant;
    null removes one)."""
    given = body.model_fields_set
    changes: dict[str, Any] = {}
    recurring = row["schedule_kind"] in (ScheduleKind.CRON, ScheduleKind.INTERVAL)
    if rescheduled is not None:
        recurring = rescheduled.recurrence is not None
    has_expect = row["expect_success_within_s"] is not None or row["expect_max_consecutive_failures"] is not None
    if "expect" in given or (has_expect and not recurring):
        expect = plan_expect(body.expect, recurring=recurring) if "expect" in given else None
        changes.update(
            expect_success_within_s=None if expect is None else expect.success_within_s,
            expect_max_consecutive_failures=None if expect is None else expect.max_consecutive_failures,
        )
    for name in CALLBACK_FIELDS:
        if name not in given:
            continue
        target_id = getattr(body, name)
        if target_id is not None and not await target_lock_live(conn, tenant_id, target_id):
            raise Problem(422, "no such target", slug="validation", field=name)
        changes[name] = target_id
    return changes


async def change_job(
    conn: AsyncConnection, tenant_id: uuid.UUID, row: RowMapping, body: JobUpdate, settings: Settings, quotas: Quotas
) -> RowMapping:
    """A PATCH of the job `row` (row-locked by the caller): the fields `body` sets change, a new
    schedule recomputes the next fire time. 409 unless the job is waiting."""
    state: JobState = row["state"]
    if state not in CHANGEABLE_STATES:
        raise state_conflict(row, "change")
    job_id = row["id"]
    given = body.model_fields_set
    if "dedup_key" in given:
        raise Problem(422, "a job's dedup_key is set when it is created", slug="validation", field="dedup_key")
    changes: dict[str, Any] = {}
    if "payload" in given:
        ensure_payload_fits(body.payload, settings)
        changes["payload"] = body.payload
    if "name" in given:
        changes["name"] = body.name
    if "priority" in given:
        changes["priority"] = body.priority
    if "labels" in given:
        changes["labels"] = body.labels or {}
    if "target_id" in given:
        if body.target_id is None:
            raise Problem(422, "a job needs a target", slug="validation", field="target_id")
        await require_live_target(conn, tenant_id, body.target_id)
        changes["target_id"] = body.target_id
    changes.update(await _chain_changes(conn, tenant_id, row, body))
    now = await store.db_now(conn)
    planned = plan_update(
        body,
        seed=hash_seed(tenant_id, row["id"]),
        state=state,
        attempts_made=row["attempt"],
        policy=policy_from_row(row),
        schedule=schedule_from_row(row),
        recurrence=lambda: recurrence_from_row(row),
        now=now,
    )
    if planned.policy is not None or planned.rescheduled is not None:
        schedule = planned.rescheduled.schedule if planned.rescheduled is not None else schedule_from_row(row)
        policy = planned.policy or policy_from_row(row)
        await ensure_job_within_quotas(conn, quotas, tenant_id, schedule, policy, now, new_jobs=0)
    changes.update(job_change_columns(planned, row["id"]))
    # The job's own completion settings: from its next attempt (an open one keeps its own).
    changes.update({name: getattr(body, name) for name in COMPLETION_FIELDS if name in given})
    changes.update(await _health_changes(conn, tenant_id, row, body, planned.rescheduled))
    if not changes:
        return row
    updated = await store.job_update(conn, job_id, state, changes)
    assert updated is not None, "the row is locked: its state cannot have changed"
    return updated
