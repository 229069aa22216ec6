"""Chained jobs at the API: creating one under a live parent of the same tenant, changing or
cancelling one that has children. The rules are app/domain/chains.py; the firing is part of
the parent's outcome statement (app/store/outcomes.py).

A chain's parent is row-locked while a child is added (a parent cancelled meanwhile cannot
end up with a new child), and the parent and the occurrences it has in flight are marked to
fire children, so a child created while its parent runs fires on that occurrence.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from sqlalchemy.engine import RowMapping

from app.api.deps import in_transaction
from app.api.errors import Problem
from app.db.async_engine import AsyncConnection
from app.domain.chains import MAX_CHAIN_DEPTH, chain_cycle
from app.domain.states import TERMINAL_STATES
from app.store.chains import job_chain_ancestors, job_chain_descendants, job_children_live, job_mark_fires_children
from app.store.job_inserts import JobAudit, NotCreated, job_create_checked
from app.store.job_rows_new import PreparedJob
from app.store.jobs import job_cancel, job_lock


def _refused(detail: str) -> Problem:
    return Problem(422, detail, slug="validation", field="after")


async def lock_parent(
    conn: AsyncConnection, tenant_id: uuid.UUID, parent_id: uuid.UUID, child_id: uuid.UUID | None = None
) -> RowMapping:
    """The parent, row-locked, once it may take `child_id` (a new job when None) as a child:
    the tenant's, not finished, not the child itself nor chained after it, and the chain no
    deeper than MAX_CHAIN_DEPTH with the child's own descendants."""
    parent = await job_lock(conn, tenant_id, parent_id)
    # Unknown and foreign jobs look the same: a tenant learns nothing of others' ids.
    if parent is None:
        raise _refused("after.job_id: no such job")
    if parent["state"] in TERMINAL_STATES:
        raise _refused(f"after.job_id: the job is {parent['state'].value}; a finished job has no more occurrences")
    ancestors = await job_chain_ancestors(conn, tenant_id, parent_id)
    if child_id is not None and chain_cycle(child_id, ancestors):
        raise _refused("after.job_id: the job runs after this one already; a chain cannot loop")
    below = 0
    if child_id is not None:
        below = max((depth for _, depth in await job_chain_descendants(conn, tenant_id, child_id)), default=0)
    if len(ancestors) + below > MAX_CHAIN_DEPTH:
        raise _refused(f"a chain may be at most {MAX_CHAIN_DEPTH} jobs deep below its first job")
    return parent


async def create_chained(
    conn: AsyncConnection, tenant_id: uuid.UUID, prepared: PreparedJob, audit: JobAudit
) -> Mapping[str, Any] | NotCreated:
    """A chained job (prepared.new.after) and its audit row, in one transaction with its
    parent's lock; or why it was not written (nothing was)."""
    link = prepared.new.after
    assert link is not None
    await in_transaction(conn)
    await lock_parent(conn, tenant_id, link.parent_id)
    created = await job_create_checked(conn, tenant_id, prepared, audit)
    if not isinstance(created, NotCreated):
        await job_mark_fires_children(conn, tenant_id, link.parent_id)
        await conn.commit()
    return created


async def cancel_chain_below(conn: AsyncConnection, tenant_id: uuid.UUID, job_id: uuid.UUID, cascade: bool) -> None:
    """After `job_id` was cancelled (its row locked by the cancel, so no child can be added
    meanwhile): with `cascade`, every unfinished job chained below it is cancelled too, nearest
    first; without, a job with unfinished chained children is a 409 (the caller's transaction
    then rolls the cancel back)."""
    if not cascade:
        if count := await job_children_live(conn, tenant_id, job_id):
            raise Problem(
                409,
                f"{count} unfinished job(s) run after this one: cancel with ?cascade=true to cancel them too",
                slug="job-has-children",
                extra={"children": count},
            )
        return
    for child, _ in sorted(await job_chain_descendants(conn, tenant_id, job_id), key=lambda found: found[1]):
        await job_cancel(conn, tenant_id, child)
