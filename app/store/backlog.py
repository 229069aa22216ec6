"""The due backlog of a set of partitions, for the per-replica metrics (app/services/backlog.py)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from sqlalchemy import SmallInteger, and_, bindparam, func, not_, select
from sqlalchemy.dialects.postgresql import ARRAY

from app.db.async_engine import AsyncConnection
from app.domain.states import CLAIMABLE_STATES
from app.store.tables import jobs
from app.store.targets import target_saturated_ids


@dataclass(frozen=True)
class Backlog:
    now: dt.datetime
    due: int
    oldest_due_at: dt.datetime | None
    held_back: int


def _backlog_statement() -> Any:
    saturated = target_saturated_ids().cte("saturated")
    held_back = jobs.c.target_id.in_(select(saturated.c.id))
    waiting = and_(
        jobs.c.state.in_([s.value for s in CLAIMABLE_STATES]),
        jobs.c.run_at <= func.now(),
        jobs.c.partition == func.any(bindparam("partitions", type_=ARRAY(SmallInteger))),
    )
    return select(
        func.now().label("now"),
        func.count().filter(not_(held_back)).label("due"),
        func.min(jobs.c.run_at).filter(not_(held_back)).label("oldest_due_at"),
        func.count().filter(held_back).label("held_back"),
    ).where(waiting)


# Built once: the compiled cache serves every sample.
_BACKLOG = _backlog_statement()


async def job_backlog_of_partitions(conn: AsyncConnection, partitions: list[int]) -> Backlog:
    row = (await conn.execute(_BACKLOG, {"partitions": partitions})).one()
    return Backlog(now=row.now, due=row.due, oldest_due_at=row.oldest_due_at, held_back=row.held_back)
