"""Declarative sets of named schedules: `PUT /v1/schedule-sets/{set}` makes the set's schedules
be exactly the ones listed, in one transaction, as the named-schedule PUT does for one key
(app/api/schedule_upserts.py): listed keys are created, changed or left alone; with `prune`,
the set's schedules no longer listed are cancelled. A schedule belongs to at most one set (a
key of another set is a 409 naming it; a key of no set joins this one).

All or nothing: every item is planned before anything is written, and any refusal (a 422
naming `schedules[i].field`, a 409) leaves the database as it was. `dry_run` answers the
same plan, each write made and rolled back (a savepoint), so it refuses what a real apply
would.

Sized for thousands of schedules: the keys are locked in one statement (sorted, so two sets
sharing keys cannot deadlock), the existing jobs are read in one, the new ones inserted with
one batch INSERT and named in one UPDATE; only changed schedules cost statements of their own.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import RowMapping

from app.api.chains import cancel_chain_below, lock_parent
from app.api.checks import ensure_payload_fits
from app.api.errors import Problem
from app.api.job_changes import change_job
from app.api.job_creates import ensure_callback_targets, not_created_problem
from app.api.quota_checks import check_job_within_limits, ensure_room_for_jobs
from app.api.quotas import Quotas
from app.api.schedule_upserts import check_key, definition_changes, refuse_delay, shown_changes, update_of
from app.api.schemas.jobs import JobCreate
from app.db.async_engine import AsyncConnection
from app.domain.job import NewJob
from app.domain.job_plan import PlanError, plan_create
from app.domain.schedule import ScheduleError
from app.ids import new_ids
from app.settings import Settings
from app.store import jobs as store
from app.store.chains import job_mark_fires_children
from app.store.job_inserts import NotCreated, job_create_many_checked
from app.store.job_rows_new import PreparedJob
from app.store.schedule_keys import job_lock_keys, job_name_many, job_set_members_unlisted
from app.store.targets import target_lock_live_many
from app.store.tenants import Caller


class SetItem(JobCreate):
    """One schedule of a set: a job's body and its key."""

    key: str


@dataclass
class SetPlan:
    set: str
    dry_run: bool
    created: list[str] = field(default_factory=list)
    changed: dict[str, list[str]] = field(default_factory=dict)
    unchanged: list[str] = field(default_factory=list)
    pruned: list[str] = field(default_factory=list)


def _at(index: int, refused: Exception) -> Problem:
    """A refusal of one item, naming `schedules[i].field`."""
    if isinstance(refused, ScheduleError | PlanError):
        return Problem(422, refused.message, slug="validation", field=f"schedules[{index}].{refused.field}")
    assert isinstance(refused, Problem)
    refused.field = f"schedules[{index}].{refused.field or 'key'}"
    return refused


def _check_keys(items: list[SetItem]) -> None:
    seen: dict[str, int] = {}
    for index, item in enumerate(items):
        try:
            check_key(item.key)
        except Problem as refused:
            raise _at(index, refused) from None
        if item.key in seen:
            first = seen[item.key]
            problem = Problem(
                422,
                f"the key {item.key!r} is listed twice: schedules[{first}] and schedules[{index}]",
                slug="validation",
                field=f"schedules[{first}].key",
            )
            problem.extra = {
                "errors": [
                    {"field": f"schedules[{first}].key", "message": "listed twice"},
                    {"field": f"schedules[{index}].key", "message": "listed twice"},
                ]
            }
            raise problem
        seen[item.key] = index


async def apply_set(
    conn: AsyncConnection,
    caller: Caller,
    set_name: str,
    items: list[SetItem],
    prune: bool,
    dry_run: bool,
    settings: Settings,
    quotas: Quotas,
) -> SetPlan:
    """Plans, then (unless `dry_run`) applies the set (module docstring)."""
    try:
        check_key(set_name)
    except Problem as refused:
        refused.field = "set"
        raise
    _check_keys(items)
    tenant_id = caller.tenant_id
    keys = [item.key for item in items]
    existing = {row["schedule_key"]: row for row in await job_lock_keys(conn, tenant_id, keys)}
    limits = await quotas.limits(conn, tenant_id)
    plan = SetPlan(set_name, dry_run)
    new_jobs: list[tuple[int, SetItem, PreparedJob]] = []
    changes: list[tuple[int, RowMapping, Any, list[str]]] = []
    adopted: list[uuid.UUID] = []
    planned: list[tuple[str, NewJob]] = []
    for index, (item, job_id) in enumerate(zip(items, new_ids(len(items)), strict=True)):
        row = existing.get(item.key)
        if row is not None and row["schedule_set"] not in (None, set_name):
            raise Problem(
                409,
                f"the schedule {item.key!r} belongs to the set {row['schedule_set']!r}",
                slug="set-conflict",
                field=f"schedules[{index}].key",
            )
        try:
            payload = ensure_payload_fits(item.payload, settings)
            refuse_delay(item)
            new = plan_create(item, tenant_id, settings.default_retry_policy, caller.now, row["id"] if row else job_id)
            check_job_within_limits(limits, new.schedule, new.policy, caller.now)
        except (ScheduleError, PlanError, Problem) as refused:
            raise _at(index, refused) from None
        planned.append((f"schedules[{index}].", new))
        if row is None:
            new_jobs.append((index, item, PreparedJob.of(new, payload, job_id)))
            plan.created.append(item.key)
            continue
        if row["schedule_set"] is None:
            adopted.append(row["id"])
        try:
            changed = definition_changes(row, new, item)
        except PlanError as refused:
            raise _at(index, refused) from None
        if not changed:
            plan.unchanged.append(item.key)
            continue
        changes.append((index, row, update_of(new, changed, item), changed))
        plan.changed[item.key] = shown_changes(changed)
    await ensure_callback_targets(conn, tenant_id, planned)
    unlisted = await job_set_members_unlisted(conn, tenant_id, set_name, keys) if prune else []
    plan.pruned = sorted(row["schedule_key"] for row in unlisted)

    savepoint = await conn.begin_nested() if dry_run else None
    await _write(conn, caller, set_name, plan, new_jobs, changes, adopted, unlisted, settings, quotas)
    if savepoint is not None:
        await savepoint.rollback()
    return plan


async def _write(
    conn: AsyncConnection,
    caller: Caller,
    set_name: str,
    plan: SetPlan,
    new_jobs: list[tuple[int, SetItem, PreparedJob]],
    changes: list[tuple[int, RowMapping, Any, list[str]]],
    adopted: list[uuid.UUID],
    unlisted: list[RowMapping],
    settings: Settings,
    quotas: Quotas,
) -> None:
    tenant_id = caller.tenant_id
    await ensure_room_for_jobs(conn, quotas, tenant_id, new_jobs=len(new_jobs))
    plain = [(index, job) for index, _, job in new_jobs if job.new.after is None]
    chained = [(index, job) for index, _, job in new_jobs if job.new.after is not None]
    live = await target_lock_live_many(conn, tenant_id, {job.new.target_id for _, _, job in new_jobs})
    for index, _, job in new_jobs:
        if job.new.target_id not in live:
            raise not_created_problem(NotCreated(target_missing=True), f"schedules[{index}].")
    for index, job in chained:
        assert job.new.after is not None
        try:
            await lock_parent(conn, tenant_id, job.new.after.parent_id)
        except Problem as refused:
            raise _at(index, refused) from None
    not_created = await job_create_many_checked(conn, tenant_id, [job for _, job in plain + chained])
    for index, job in plain + chained:
        if job.id in not_created:
            raise not_created_problem(not_created[job.id], f"schedules[{index}].")
    for _, job in chained:
        assert job.new.after is not None
        await job_mark_fires_children(conn, tenant_id, job.new.after.parent_id)
    keys = {job.id: item.key for _, item, job in new_jobs}
    await job_name_many(conn, [*keys, *adopted], [*keys.values(), *([None] * len(adopted))], set_name)
    for index, row, update, _ in changes:
        try:
            await change_job(conn, tenant_id, row, update, settings, quotas)
        except Problem as refused:
            if refused.status == 422:
                raise _at(index, refused) from None
            raise
    for row in unlisted:
        cancelled = await store.job_cancel(conn, tenant_id, row["id"])
        assert cancelled is not None, "the row is locked and unfinished"
        try:
            await cancel_chain_below(conn, tenant_id, row["id"], cascade=False)
        except Problem as refused:
            refused.field = "prune"
            refused.detail = f"{row['schedule_key']!r}: {refused.detail}"
            raise
