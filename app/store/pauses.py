"""Pause and hold in the store: a target's pause (POST /v1/targets/{id}/pause) or a whole
tenant's (POST /v1/admin/tenants/{t}/pause), the occurrences a pause holds, and the resume
that releases them; and what the reaper does for them (app/services/hold_watch.py).

While a target or its tenant is paused, no claim takes its jobs (app/store/targets.py:
target_paused). Its waiting occurrences are *held*: their run_at is HELD ('infinity', past
every claim's due range, which a claim scans in run_at order and would otherwise walk through
held rows on every poll), the run_at they had kept in held_run_at. The pause holds them in
its own transaction; jobs that come due afterwards (created, retried, next occurrences) are
held by the reaper as they near their time, and the claim leaves them out meanwhile. An
attempt already in flight when the pause comes ends as it would have.

A resume releases them (app/domain/occurrences.py: OnResume): `deliver_all` makes each due
from its release (so no misfire policy gives it up for the pause), `misfire_policy` gives a
recurring job's occurrence its own time back, so its policy judges it as if it had not been
held. Either way the release may be spread in the occurrences' own order, one every 1/rate s,
at the drain rate asked for or the target's rate_per_s, whichever is lower.

Each target's edge is reported once, in the transaction that makes it: target.paused when it
goes from delivering to paused, target.resumed (with how many occurrences it released) when
it comes back. A resume while the tenant is paused releases nothing (the tenant's resume will).

Locks: a pause holds jobs before it locks its target, and a resume releases them before; the
claim locks candidate jobs before their limited targets (app/store/claims.py), so neither
waits for the other in a cycle. Released rows are held ones only, never a claim's candidates.
"""

from __future__ import annotations

import datetime as dt
import functools
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Double, Integer, Text, and_, bindparam, case, func, literal, select, true, union_all, update
from sqlalchemy.dialects.postgresql import ARRAY, UUID
from sqlalchemy.engine import RowMapping

from app.db.async_engine import AsyncConnection
from app.domain.events import EventType
from app.domain.occurrences import OnResume
from app.domain.priority import MAX_PRIORITY, MIN_PRIORITY
from app.domain.schedule import ScheduleKind
from app.domain.states import CLAIMABLE_STATES, JobState
from app.store.events import event_emit
from app.store.job_rows import HELD
from app.store.tables import int_constant, jobs, state_in, targets, tenants
from app.store.targets import PUBLIC_COLUMNS, target_live, target_paused

# A pause's own columns, cleared together by a resume.
_UNPAUSED = {"paused_at": None, "paused_until": None, "paused_reason": None}
# States in which a job may carry a held_run_at a release clears: held (waiting), or moved on
# since (paused by the user, finished). Never running: a held occurrence is not claimed.
_RELEASABLE = [state for state in JobState if state is not JobState.RUNNING]


@dataclass(frozen=True)
class PauseChange:
    """A pause's or a resume's result: the row as it is now, whether it was an edge (the target
    or tenant was not paused before a pause, was paused before a resume), and how many
    occurrences it held (pause) or released (resume)."""

    row: RowMapping
    edge: bool
    count: int


def pause_event_data(row: RowMapping, **more: Any) -> dict[str, Any]:
    """target.paused / target.resumed's data: the pause as it is (paused) or was (resumed)."""
    until: dt.datetime | None = row["paused_until"]
    return {
        "target_id": str(row["id"]),
        "name": row["name"],
        "reason": row["paused_reason"],
        "kind": row["pause_kind"],
        "paused_until": None if until is None else until.isoformat(),
        "consecutive_failures": row["consecutive_failures"],
        **more,
    }


@functools.cache
def _hold_statement(of_target: bool) -> Any:
    """Holds the waiting occurrences of a tenant (or of one of its targets) not held yet."""
    conditions = [
        jobs.c.tenant_id == bindparam("of_tenant", type_=UUID(as_uuid=True)),
        state_in(CLAIMABLE_STATES),
        jobs.c.run_at < HELD,
    ]
    if of_target:
        conditions.append(jobs.c.target_id == bindparam("of_target", type_=UUID(as_uuid=True)))
    return update(jobs).where(*conditions).values(held_run_at=jobs.c.run_at, run_at=HELD, updated_at=func.now())


@functools.cache
def _release_statement() -> Any:
    """Releases the held occurrences of `target_ids` (clearing the held_run_at of those that
    moved on since), per on_resume and spread at the lower of drain_rate_per_s and each
    target's rate_per_s; returns one row per job, `released` where it was held."""
    held = and_(state_in(CLAIMABLE_STATES), jobs.c.run_at == HELD)
    found = (
        select(
            jobs.c.id,
            held.label("held"),
            # In their own order (due time, then id), each target's held ones from 0.
            (
                func.row_number().over(partition_by=(jobs.c.target_id, held), order_by=(jobs.c.held_run_at, jobs.c.id))
                - 1
            ).label("position"),
            func.least(bindparam("drain_rate_per_s", type_=Double), targets.c.rate_per_s).label("rate"),
        )
        .join(targets, targets.c.id == jobs.c.target_id)
        .where(
            # ix_jobs_held
            jobs.c.target_id == func.any(bindparam("target_ids", type_=ARRAY(UUID(as_uuid=True)))),
            jobs.c.held_run_at.is_not(None),
            state_in(_RELEASABLE),
        )
        .cte("found")
    )
    spread = func.now() + func.make_interval(0, 0, 0, 0, 0, 0, found.c.position / found.c.rate)
    # Due from the release (no rate: at once), or at its own time when that is still ahead.
    released_at = func.greatest(jobs.c.held_run_at, func.coalesce(spread, func.now()))
    own_time = and_(
        bindparam("on_resume", type_=Text) == literal(OnResume.MISFIRE_POLICY.value, Text),
        # A recurring job's occurrence before its first attempt: the misfire policy judges it
        # by its run_at (due_delay). One-offs and retries have no misfire to apply.
        jobs.c.attempt == 0,
        jobs.c.schedule_kind.in_([ScheduleKind.CRON.value, ScheduleKind.INTERVAL.value]),
    )
    still_held = and_(state_in(CLAIMABLE_STATES), jobs.c.run_at == HELD)
    return (
        update(jobs)
        .where(jobs.c.id == found.c.id, jobs.c.held_run_at.is_not(None), state_in(_RELEASABLE))
        .values(
            run_at=case((~still_held, jobs.c.run_at), (own_time, jobs.c.held_run_at), else_=released_at),
            held_run_at=None,
            # A deliberate pause: what it kept from running is not held against the job's health.
            resumed_at=func.now(),
            updated_at=func.now(),
        )
        .returning(found.c.held.label("released"))
    )


async def job_release_held(
    conn: AsyncConnection, target_ids: list[uuid.UUID], on_resume: OnResume, drain_rate_per_s: float | None
) -> int:
    """Releases the held occurrences of `target_ids`; how many."""
    if not target_ids:
        return 0
    params = {"target_ids": target_ids, "on_resume": on_resume.value, "drain_rate_per_s": drain_rate_per_s}
    return sum(1 for row in await conn.execute(_release_statement(), params) if row.released)


async def job_hold_of_target(conn: AsyncConnection, tenant_id: uuid.UUID, target_id: uuid.UUID) -> int:
    """Holds the target's waiting occurrences (all of them, due or not); how many."""
    return (
        await conn.execute(_hold_statement(of_target=True), {"of_tenant": tenant_id, "of_target": target_id})
    ).rowcount


async def _target_lock(conn: AsyncConnection, tenant_id: uuid.UUID, target_id: uuid.UUID) -> RowMapping | None:
    stmt = select(*PUBLIC_COLUMNS).where(target_live(tenant_id, target_id)).with_for_update()
    return (await conn.execute(stmt)).mappings().one_or_none()


async def _target_set(conn: AsyncConnection, target_id: uuid.UUID, values: dict[str, Any]) -> RowMapping:
    stmt = update(targets).where(targets.c.id == target_id).values(**values, updated_at=func.now())
    return (await conn.execute(stmt.returning(*PUBLIC_COLUMNS))).mappings().one()


def _pause_values(before: Any, given: dict[str, Any], **on_edge: Any) -> tuple[dict[str, Any], bool]:
    """What pausing a target or tenant row `before` writes: the `reason` and `until` given,
    and on the edge (it was not paused) the pause itself plus `on_edge`; and whether it is one."""
    values: dict[str, Any] = {}
    if "reason" in given:
        values["paused_reason"] = given["reason"]
    if "until" in given:
        values["paused_until"] = given["until"]
    edge = before["paused_at"] is None
    if edge:
        values.update(paused_at=func.now(), **on_edge)
    return values, edge


async def target_pause(
    conn: AsyncConnection, tenant_id: uuid.UUID, target_id: uuid.UUID, given: dict[str, Any]
) -> PauseChange | None:
    """Pauses the target (or, paused already, changes the `reason` and `until` in `given`) and
    holds its waiting occurrences; target.paused on the edge. None: no such live target."""
    # Jobs first, then the target (the module's lock order).
    held = await job_hold_of_target(conn, tenant_id, target_id)
    before = await _target_lock(conn, tenant_id, target_id)
    if before is None:
        return None
    values, edge = _pause_values(before, given, pause_kind="manual")
    row = await _target_set(conn, target_id, values) if values else before
    if edge:
        await event_emit(conn, tenant_id, EventType.TARGET_PAUSED, pause_event_data(row))
    return PauseChange(row, edge, held)


async def target_resume(
    conn: AsyncConnection,
    tenant_id: uuid.UUID,
    target_id: uuid.UUID,
    on_resume: OnResume,
    drain_rate_per_s: float | None,
    *,
    expired_only: bool = False,
) -> PauseChange | None:
    """Resumes the target, its failure run reset, and releases its held occurrences unless
    its tenant is paused; target.resumed on the edge. None: no such live target, or with
    `expired_only` (the reaper's) none whose paused_until has passed."""
    current = (await conn.execute(select(*PUBLIC_COLUMNS).where(target_live(tenant_id, target_id)))).mappings()
    seen = current.one_or_none()
    if seen is None or (expired_only and not await _expired(conn, seen["paused_until"])):
        return None
    # The tenant's pause holds them still (its resume releases them); share-locked, so a
    # tenant's resume that did not see this target's pause end is not under way meanwhile.
    tenant = select(tenants.c.paused_at).where(tenants.c.id == tenant_id).with_for_update(read=True)
    tenant_paused = (await conn.execute(tenant)).scalar_one_or_none() is not None
    # Released before the target is locked (the module's lock order).
    released = 0 if tenant_paused else await job_release_held(conn, [target_id], on_resume, drain_rate_per_s)
    before = await _target_lock(conn, tenant_id, target_id)
    if before is None:
        return None
    edge = before["paused_at"] is not None
    if not edge:
        return PauseChange(before, False, released)
    row = await _target_set(conn, target_id, {**_UNPAUSED, "pause_kind": None, "consecutive_failures": 0})
    await event_emit(conn, tenant_id, EventType.TARGET_RESUMED, pause_event_data(before, released=released))
    return PauseChange(row, edge, released)


async def _expired(conn: AsyncConnection, until: dt.datetime | None) -> bool:
    """Whether a pause's paused_until has passed, on the database's clock."""
    if until is None:
        return False
    now: dt.datetime = (await conn.execute(select(func.now()))).scalar_one()
    return until <= now


_TENANT_COLUMNS = (tenants.c.id, tenants.c.name, tenants.c.paused_at, tenants.c.paused_until, tenants.c.paused_reason)


async def _tenant_lock(conn: AsyncConnection, tenant_id: uuid.UUID) -> RowMapping | None:
    stmt = select(*_TENANT_COLUMNS).where(tenants.c.id == tenant_id).with_for_update()
    return (await conn.execute(stmt)).mappings().one_or_none()


async def _tenant_set(conn: AsyncConnection, tenant_id: uuid.UUID, values: dict[str, Any]) -> RowMapping:
    stmt = update(tenants).where(tenants.c.id == tenant_id).values(**values).returning(*_TENANT_COLUMNS)
    return (await conn.execute(stmt)).mappings().one()


async def tenant_pause(conn: AsyncConnection, tenant_id: uuid.UUID, given: dict[str, Any]) -> PauseChange | None:
    """Pauses the whole tenant (or changes the `reason` and `until` in `given`) and holds the
    waiting occurrences of all its targets. No event: the types are about targets, and each
    target's own pause is unchanged. None: no such tenant."""
    held = (await conn.execute(_hold_statement(of_target=False), {"of_tenant": tenant_id})).rowcount
    before = await _tenant_lock(conn, tenant_id)
    if before is None:
        return None
    values, edge = _pause_values(before, given)
    row = await _tenant_set(conn, tenant_id, values) if values else before
    return PauseChange(row, edge, held)


async def tenant_resume(
    conn: AsyncConnection,
    tenant_id: uuid.UUID,
    on_resume: OnResume,
    drain_rate_per_s: float | None,
    *,
    expired_only: bool = False,
) -> PauseChange | None:
    """Resumes the tenant and releases the held occurrences of its targets that are not
    paused themselves. None: no such tenant, or with `expired_only` (the reaper's) not one
    whose paused_until has passed."""
    before = await _tenant_lock(conn, tenant_id)
    if before is None:
        return None
    if expired_only and not await _expired(conn, before["paused_until"]):
        return None
    running = select(targets.c.id).where(targets.c.tenant_id == tenant_id, targets.c.paused_at.is_(None))
    released = await job_release_held(conn, list((await conn.execute(running)).scalars()), on_resume, drain_rate_per_s)
    edge = before["paused_at"] is not None
    row = await _tenant_set(conn, tenant_id, _UNPAUSED) if edge else before
    return PauseChange(row, edge, released)


# The reaper's side (app/services/hold_watch.py).

# Occurrences of paused targets due within this are held by each pass: ahead of the reaper's
# next pass, so that few come due unheld (the claim skips those meanwhile, reading them).
HOLD_AHEAD_S = 60.0


@functools.cache
def _hold_due_statement() -> Any:
    """Holds up to `limit` waiting occurrences of paused targets (or targets of paused
    tenants) due within HOLD_AHEAD_S. Found per paused target's tenant and priority level by
    short probes of ix_jobs_tenant_due, however many are held already. Never waits: targets
    and tenants being paused or resumed now are left to the next pass, as are jobs a claim
    has locked."""
    paused = (
        select(targets.c.id, targets.c.tenant_id)
        .join(tenants, tenants.c.id == targets.c.tenant_id)
        .where(targets.c.deleted_at.is_(None), (targets.c.paused_at.is_not(None)) | (tenants.c.paused_at.is_not(None)))
        .with_for_update(read=True, skip_locked=True, of=(targets, tenants))
        .cte("paused")
    )
    paused_tenants = select(paused.c.tenant_id).distinct().cte("paused_tenants")
    limit = bindparam("limit", type_=Integer)
    ahead = func.now() + func.make_interval(0, 0, 0, 0, 0, 0, literal(HOLD_AHEAD_S, Double))
    probes = []
    for level in range(MIN_PRIORITY, MAX_PRIORITY + 1):
        probe = (
            select(jobs.c.id)
            .where(
                jobs.c.tenant_id == paused_tenants.c.tenant_id,
                jobs.c.priority == int_constant(level),
                state_in(CLAIMABLE_STATES),
                jobs.c.run_at <= ahead,
                jobs.c.target_id.in_(select(paused.c.id)),
            )
            .order_by(jobs.c.run_at)
            .limit(limit)
            .with_for_update(skip_locked=True, of=jobs)
            .lateral(f"level_{level}")
        )
        probes.append(select(probe.c.id).select_from(paused_tenants.join(probe, true())))
    picked = union_all(*probes).subquery("picked")
    return (
        update(jobs)
        .where(jobs.c.id.in_(select(picked.c.id).limit(limit)), state_in(CLAIMABLE_STATES), jobs.c.run_at < HELD)
        .values(held_run_at=jobs.c.run_at, run_at=HELD, updated_at=func.now())
    )


async def job_hold_due(conn: AsyncConnection, limit: int) -> int:
    """Holds up to `limit` occurrences of paused targets that are due or nearly; how many."""
    return (await conn.execute(_hold_due_statement(), {"limit": limit})).rowcount


async def target_list_pause_expired(conn: AsyncConnection, limit: int) -> list[tuple[uuid.UUID, uuid.UUID]]:
    """(tenant_id, target_id) of paused targets whose paused_until has passed."""
    stmt = (
        select(targets.c.tenant_id, targets.c.id)
        .where(targets.c.paused_until <= func.now(), targets.c.paused_at.is_not(None), targets.c.deleted_at.is_(None))
        .limit(limit)
    )
    return [(row.tenant_id, row.id) for row in await conn.execute(stmt)]


async def tenant_list_pause_expired(conn: AsyncConnection, limit: int) -> list[uuid.UUID]:
    stmt = select(tenants.c.id).where(tenants.c.paused_until <= func.now(), tenants.c.paused_at.is_not(None))
    return list((await conn.execute(stmt.limit(limit))).scalars())


@functools.cache
def _unheld_targets_statement() -> Any:
    """Targets with held occurrences (or stale held_run_at) that no pause holds any more: a
    held job moved to another target, a resume that raced a pause. One probe of ix_jobs_held
    per target that has any (a loose index scan), not one per held row."""

    def lowest(*after: Any) -> Any:
        held = select(jobs.c.target_id).where(jobs.c.held_run_at.is_not(None), *after)
        return held.order_by(jobs.c.target_id).limit(1).scalar_subquery()

    walk = select(lowest().label("id")).cte("held_targets", recursive=True)
    walk = walk.union_all(select(lowest(jobs.c.target_id > walk.c.id)).where(walk.c.id.is_not(None)))
    return (
        select(targets.c.id)
        .join(walk, walk.c.id == targets.c.id)
        .where(~target_paused())
        .limit(bindparam("limit", type_=Integer))
    )


async def target_list_unheld(conn: AsyncConnection, limit: int) -> list[uuid.UUID]:
    return list((await conn.execute(_unheld_targets_statement(), {"limit": limit})).scalars())


async def target_lock_unpaused(conn: AsyncConnection, target_id: uuid.UUID) -> bool:
    """Share-locks the target if neither it nor its tenant is paused (a pause of it waits)."""
    stmt = select(targets.c.id).where(targets.c.id == target_id, ~target_paused()).with_for_update(read=True)
    return (await conn.execute(stmt)).first() is not None
