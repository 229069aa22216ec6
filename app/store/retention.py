"""Retention, like River's job cleaner: old history deleted in small batches by the reaper.

- finished jobs (succeeded, cancelled, dead) whose `finished_at` is older than the retention
  period, with their runs (in the same statement: runs have no foreign key to cascade
  from, see tables.runs); a job that still has a dead letter is kept;
- dead letters older than their own retention period, when one is set (default: kept until
  deleted through the API);
- the runs of a recurring job beyond its newest N.

Each statement deletes at most `limit` rows picked with SKIP LOCKED, so it holds few locks
for a short time and never waits on a scheduler; plain DELETEs, no table rewrite (autovacuum
reclaims the space). Idempotency keys have their own purge (app/store/idempotency.py).
"""

from __future__ import annotations

import functools
import uuid
from typing import Any

from sqlalchemy import BigInteger, Double, Integer, Select, bindparam, delete, func, literal_column, select
from sqlalchemy.dialects.postgresql import UUID

from app.db.async_engine import AsyncConnection
from app.domain.schedule import ScheduleKind
from app.domain.states import TERMINAL_STATES
from app.store.tables import dead_letters, jobs, runs

_FINISHED = sorted(state.value for state in TERMINAL_STATES)


def _days_ago() -> Any:
    seconds = bindparam("days", type_=Double) * 86_400
    return func.now() - func.make_interval(0, 0, 0, 0, 0, 0, seconds)


@functools.cache
def _job_delete_finished_statement() -> Any:
    has_dead_letter = select(dead_letters.c.id).where(dead_letters.c.job_id == jobs.c.id).exists()
    victims = (
        select(jobs.c.id)
        .where(jobs.c.state.in_(_FINISHED), jobs.c.finished_at < _days_ago(), ~has_dead_letter)
        .order_by(jobs.c.finished_at)
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(skip_locked=True)
    )
    gone = delete(jobs).where(jobs.c.id.in_(victims.scalar_subquery())).returning(jobs.c.id).cte("gone")
    runs_gone = delete(runs).where(runs.c.job_id.in_(select(gone.c.id))).cte("runs_gone")
    return select(func.count()).select_from(gone).add_cte(runs_gone)


async def job_delete_finished(conn: AsyncConnection, older_than_days: float, limit: int) -> int:
    """Deletes up to `limit` finished jobs (and their runs) finished more than `older_than_days`
    ago, oldest first (ix_jobs_finished); returns how many jobs."""
    deleted = await conn.scalar(_job_delete_finished_statement(), {"days": older_than_days, "limit": limit})
    return int(deleted or 0)


@functools.cache
def _dead_letter_delete_expired_statement() -> Any:
    victims = (
        select(dead_letters.c.id)
        .where(dead_letters.c.created_at < _days_ago())
        .order_by(dead_letters.c.created_at)
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(skip_locked=True)
    )
    return delete(dead_letters).where(dead_letters.c.id.in_(victims.scalar_subquery()))


async def dead_letter_delete_expired(conn: AsyncConnection, older_than_days: float, limit: int) -> int:
    """Deletes up to `limit` dead letters created more than `older_than_days` ago; returns how many."""
    result = await conn.execute(_dead_letter_delete_expired_statement(), {"days": older_than_days, "limit": limit})
    return int(result.rowcount)


def _recurring_with_surplus() -> Select[tuple[uuid.UUID]]:
    """The next `jobs_limit` recurring jobs after the cursor `after` that have run more than
    `keep` times (one-offs have a handful of runs and go with their job)."""
    return (
        select(jobs.c.id)
        .where(
            jobs.c.schedule_kind != ScheduleKind.ONCE,
            jobs.c.occurrences_run > bindparam("keep", type_=BigInteger),
            jobs.c.id > bindparam("after", type_=UUID(as_uuid=True)),
        )
        .order_by(jobs.c.id)
        .limit(bindparam("jobs_limit", type_=Integer))
    )


@functools.cache
def _run_delete_beyond_kept_statement() -> Any:
    recurring = _recurring_with_surplus().subquery("recurring")
    # Per job, the runs older than its newest `keep` (ix_runs_job: job_id, id).
    beyond = (
        select(runs.c.id)
        .where(runs.c.job_id == recurring.c.id)
        .order_by(runs.c.id.desc())
        .offset(bindparam("keep", type_=BigInteger))
        .limit(bindparam("limit", type_=Integer))
        .lateral("beyond")
    )
    victims = (
        select(beyond.c.id)
        .select_from(recurring.join(beyond, literal_column("true")))
        .limit(bindparam("limit", type_=Integer))
    )
    return delete(runs).where(runs.c.id.in_(victims.scalar_subquery()))


@functools.cache
def _recurring_cursor_statement() -> Any:
    stretch = _recurring_with_surplus().subquery()
    return select(stretch.c.id).order_by(stretch.c.id.desc()).limit(1)


_FIRST = uuid.UUID(int=0)


async def run_delete_beyond_kept(
    conn: AsyncConnection, keep: int, limit: int, after: uuid.UUID | None = None, jobs_limit: int = 50
) -> tuple[int, uuid.UUID | None]:
    """Deletes up to `limit` runs beyond the newest `keep` of recurring jobs, for the next
    `jobs_limit` jobs after `after` (by id); returns how many, and the cursor for the next
    call (None: the walk is through, start over)."""
    params = {"keep": keep, "limit": limit, "after": after or _FIRST, "jobs_limit": jobs_limit}
    result = await conn.execute(_run_delete_beyond_kept_statement(), params)
    deleted = int(result.rowcount)
    if deleted >= limit:
        return deleted, after  # more beyond `keep` in this stretch: the same jobs again
    last = await conn.scalar(_recurring_cursor_statement(), params)
    return deleted, last
