"""Events in the store: writing an event as one one-off job per subscription that wants its
type (app/domain/events.py), in the caller's transaction, so the event commits or rolls
back with the change it reports. The outcome statement (app/store/outcomes.py) builds its
events from the same column values (event_job_values)."""

from __future__ import annotations

import functools
import json
import uuid
from typing import Any

from sqlalchemy import Integer, SmallInteger, Text, bindparam, cast, func, literal, literal_column, select
from sqlalchemy.dialects.postgresql import JSONB, UUID, insert

from app.db.async_engine import AsyncConnection
from app.domain.events import (
    EVENT_BACKOFF_BASE_S,
    EVENT_BACKOFF_FACTOR,
    EVENT_BACKOFF_MAX_S,
    EVENT_MAX_ATTEMPTS,
    EventType,
)
from app.domain.partition import PARTITION_COUNT
from app.domain.schedule import ScheduleKind
from app.domain.states import JobState
from app.store.tables import job_state, jobs, targets
from app.store.tables_watch import event_subscriptions


def event_body(event_id: Any, event_type: Any, tenant_id: Any, data: Any) -> Any:
    """The event's JSON body, built by the statement that writes it."""
    return func.jsonb_build_object(
        literal("id", Text),
        event_id,
        literal("type", Text),
        event_type,
        literal("created_at", Text),
        func.now(),
        literal("tenant_id", Text),
        tenant_id,
        literal("data", Text),
        data,
    )


def event_job_values(
    *, event_id: Any, event_type: Any, tenant_id: Any, target_id: Any, partition: Any, data: Any
) -> dict[str, Any]:
    """The jobs row of one event's delivery, as SQL expressions: a one-off due now to
    `target_id`, whose occurrence id (its webhook-id) is the event's id."""
    now = func.now()
    return {
        "id": func.gen_random_uuid(),
        "partition": partition,
        "tenant_id": tenant_id,
        "target_id": target_id,
        "name": func.concat(literal("event: ", Text), event_type),
        "payload": event_body(event_id, event_type, tenant_id, data),
        "state": cast(literal(JobState.SCHEDULED.value), job_state),
        "schedule_kind": literal(ScheduleKind.ONCE.value),
        "schedule_anchor_at": now,
        "scheduled_for": now,
        "run_at": now,
        "occurrence_id": event_id,
        "max_attempts": literal(EVENT_MAX_ATTEMPTS, Integer),
        "backoff_base_s": literal(EVENT_BACKOFF_BASE_S),
        "backoff_max_s": literal(EVENT_BACKOFF_MAX_S),
        "backoff_factor": literal(EVENT_BACKOFF_FACTOR),
        "event_type": event_type,
    }


def subscribed_targets(tenant_id: Any, event_type: Any) -> Any:
    """The live targets of the tenant's subscriptions to `event_type` (a FROM clause)."""
    return (
        select(event_subscriptions.c.target_id)
        .join(targets, targets.c.id == event_subscriptions.c.target_id)
        .where(
            event_subscriptions.c.tenant_id == tenant_id,
            event_subscriptions.c.types.any_() == event_type,
            targets.c.tenant_id == tenant_id,
            targets.c.deleted_at.is_(None),
        )
    )


def random_partition() -> Any:
    """A partition for an event about no job: any scheduler may deliver it."""
    return cast(func.floor(func.random() * literal_column(str(PARTITION_COUNT))), SmallInteger)


@functools.cache
def _emit_statement() -> Any:
    tenant = bindparam("tenant_id", type_=UUID(as_uuid=True))
    event_type = bindparam("event_type", type_=Text)
    dest = subscribed_targets(tenant, event_type).subquery("dest")
    # One event id per subscription: each delivery is its own event, with its own webhook-id.
    per_target = select(dest.c.target_id, func.gen_random_uuid().label("event_id")).subquery("per_target")
    values = event_job_values(
        event_id=per_target.c.event_id,
        event_type=event_type,
        tenant_id=tenant,
        target_id=per_target.c.target_id,
        partition=random_partition(),
        data=cast(bindparam("data", type_=Text), JSONB),
    )
    rows = select(*(value.label(name) for name, value in values.items()))
    return insert(jobs).from_select(list(values), rows).returning(jobs.c.id)


async def event_emit(conn: AsyncConnection, tenant_id: uuid.UUID, event_type: EventType, data: dict[str, Any]) -> int:
    """Writes one event of `event_type` about `data` for each of the tenant's subscriptions
    to it; returns how many deliveries it made (0: nobody subscribed). In the caller's
    transaction: call it with the change it reports."""
    params = {"tenant_id": tenant_id, "event_type": event_type.value, "data": json.dumps(data, default=str)}
    return len((await conn.execute(_emit_statement(), params)).all())
