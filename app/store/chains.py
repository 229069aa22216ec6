"""Chains in the store: a chained job's ancestors and descendants (each walk bounded by the
depth limit), marking a parent whose settling must fire children, and a parent's live
children. The firing itself is part of the outcome statement (app/store/outcomes.py)."""

from __future__ import annotations

import uuid

from sqlalchemy import Integer, and_, func, literal, or_, select, update

from app.db.async_engine import AsyncConnection
from app.domain.chains import MAX_CHAIN_DEPTH
from app.domain.states import TERMINAL_STATES
from app.store.tables import jobs

_TERMINAL = sorted(state.value for state in TERMINAL_STATES)


async def job_chain_ancestors(conn: AsyncConnection, tenant_id: uuid.UUID, job_id: uuid.UUID) -> list[uuid.UUID]:
    """`job_id` and the jobs it runs after, nearest first, within the tenant: at most
    MAX_CHAIN_DEPTH + 2 of them (enough to tell a chain too deep, and to stop on a cycle)."""
    first = select(jobs.c.id, jobs.c.after_job_id, literal(0, Integer).label("depth")).where(
        jobs.c.id == job_id, jobs.c.tenant_id == tenant_id
    )
    walk = first.cte("ancestors", recursive=True)
    step = select(jobs.c.id, jobs.c.after_job_id, (walk.c.depth + 1).label("depth")).where(
        jobs.c.id == walk.c.after_job_id, jobs.c.tenant_id == tenant_id, walk.c.depth <= MAX_CHAIN_DEPTH
    )
    walk = walk.union_all(step)
    rows = await conn.execute(select(walk.c.id).order_by(walk.c.depth))
    return list(rows.scalars())


async def job_chain_descendants(
    conn: AsyncConnection, tenant_id: uuid.UUID, job_id: uuid.UUID
) -> list[tuple[uuid.UUID, int]]:
    """The unfinished jobs chained after `job_id`, directly or not, with their distance from
    it (1: its children), within the tenant and the depth limit."""
    first = select(jobs.c.id, literal(1, Integer).label("depth")).where(
        jobs.c.after_job_id == job_id, jobs.c.tenant_id == tenant_id, jobs.c.state.not_in(_TERMINAL)
    )
    walk = first.cte("descendants", recursive=True)
    step = select(jobs.c.id, (walk.c.depth + 1).label("depth")).where(
        jobs.c.after_job_id == walk.c.id,
        jobs.c.tenant_id == tenant_id,
        jobs.c.state.not_in(_TERMINAL),
        walk.c.depth <= MAX_CHAIN_DEPTH,
    )
    walk = walk.union_all(step)
    rows = await conn.execute(select(walk.c.id, walk.c.depth))
    return [(row.id, row.depth) for row in rows]


async def job_mark_fires_children(conn: AsyncConnection, tenant_id: uuid.UUID, parent_id: uuid.UUID) -> None:
    """The parent, and the unfinished one-offs carrying its occurrences (triggers, hand-offs,
    a chained job's occurrences), now fire chained children when they settle. An occurrence
    in flight is marked too (its outcome reads the mark when it is written), so a child
    created while its parent runs fires on that occurrence."""
    carries = or_(jobs.c.id == parent_id, and_(jobs.c.parent_job_id == parent_id, jobs.c.state.not_in(_TERMINAL)))
    await conn.execute(
        update(jobs)
        .where(jobs.c.tenant_id == tenant_id, carries, jobs.c.fires_children.is_(False))
        .values(fires_children=True)
    )


async def job_children_live(conn: AsyncConnection, tenant_id: uuid.UUID, job_id: uuid.UUID) -> int:
    """How many unfinished jobs are chained directly after `job_id`."""
    stmt = select(func.count()).where(
        jobs.c.after_job_id == job_id, jobs.c.tenant_id == tenant_id, jobs.c.state.not_in(_TERMINAL)
    )
    return int(await conn.scalar(stmt) or 0)
