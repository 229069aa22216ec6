"""What the outcome statement (app/store/outcomes.py) writes besides the jobs' new states:
events about settled occurrences (to subscriptions and per-job callbacks), and each
target's run of failed attempts, which pauses a target with auto_pause when it reaches N
(emitting target.auto_paused). All are CTEs of that one statement: no round trip is added
per delivery, and an event commits exactly when the outcome it reports does.

`applied` is the statement's UPDATE of jobs: its RETURNING columns, with the settled
attempt's own values (SETTLED_COLUMNS, as `settled_<name>`) from the batch row it joined.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Text, and_, case, func, literal, literal_column, select, union_all, update
from sqlalchemy.dialects.postgresql import insert

from app.domain.chains import ChainOn
from app.domain.events import EventType
from app.domain.job import RunOutcome
from app.store.events import event_job_values, random_partition
from app.store.tables import jobs, targets
from app.store.tables_watch import event_subscriptions

# Attempts that count against a target's auto_pause: the receiver failed (a lease that
# expired or an attempt cancelled says nothing about it).
TARGET_FAILURES = [
    RunOutcome.HTTP_ERROR,
    RunOutcome.TIMEOUT,
    RunOutcome.CONNECTION_ERROR,
    RunOutcome.FAILED,
    RunOutcome.ASYNC_TIMEOUT,
    RunOutcome.HEARTBEAT_TIMEOUT,
]


# The batch row's columns the events need, returned by the UPDATE as settled_<name>.
SETTLED_COLUMNS = ("settled", "outcome", "occurrence_id", "scheduled_for", "attempt", "status_code", "error")


def _insert_events(planned: Any) -> Any:
    """The INSERT of one event delivery per planned row (event_id, event_type, tenant_id,
    dest, partition, data), to live targets of the same tenant only."""
    values = event_job_values(
        event_id=planned.c.event_id,
        event_type=planned.c.event_type,
        tenant_id=planned.c.tenant_id,
        target_id=planned.c.dest,
        partition=planned.c.partition,
        data=planned.c.data,
    )
    rows = (
        select(*(value.label(name) for name, value in values.items()))
        .select_from(planned)
        .join(
            targets,
            and_(
                targets.c.id == planned.c.dest,
                targets.c.tenant_id == planned.c.tenant_id,
                targets.c.deleted_at.is_(None),
            ),
        )
    )
    return insert(jobs).from_select(list(values), rows)


def _subscribed(tenant_id: Any, event_type: Any) -> Any:
    return and_(event_subscriptions.c.tenant_id == tenant_id, event_type == event_subscriptions.c.types.any_())


def emit_occurrence_events(applied: Any) -> Any:
    """occurrence.succeeded / occurrence.dead_lettered for each occurrence settled here, to
    the tenant's subscriptions and to the job's own callback target; never about an event's
    own delivery."""
    settled = applied.c.settled_settled
    succeeded = settled == ChainOn.SUCCESS.value
    event_type = case(
        (succeeded, literal(EventType.OCCURRENCE_SUCCEEDED.value, Text)),
        else_=literal(EventType.OCCURRENCE_DEAD_LETTERED.value, Text),
    )
    data = func.jsonb_build_object(
        *_pairs(
            # The job whose occurrence it was: a trigger's or hand-off's carrier names its parent.
            job_id=func.coalesce(applied.c.parent_job_id, applied.c.id),
            name=applied.c.name,
            schedule_key=applied.c.schedule_key,
            labels=applied.c.labels,
            occurrence_id=applied.c.settled_occurrence_id,
            scheduled_for=applied.c.settled_scheduled_for,
            attempts=applied.c.settled_attempt,
            outcome=applied.c.settled_outcome,
            status_code=applied.c.settled_status_code,
            error=applied.c.settled_error,
        )
    )
    common = [
        applied.c.tenant_id,
        applied.c.partition,
        event_type.label("event_type"),
        data.label("data"),
    ]
    wanted = [settled.is_not(None), applied.c.event_type.is_(None)]
    subscribed = (
        select(*common, event_subscriptions.c.target_id.label("dest"))
        .join(event_subscriptions, _subscribed(applied.c.tenant_id, event_type))
        .where(*wanted)
    )
    callback = case((succeeded, applied.c.on_success_target_id), else_=applied.c.on_failure_target_id)
    callbacks = select(*common, callback.label("dest")).where(*wanted)
    callbacks = callbacks.where(callback.is_not(None))
    both = union_all(subscribed, callbacks).subquery("occurrence_events")
    # A CTE of its own: gen_random_uuid() is volatile, so it is evaluated once per row and
    # the event id in the body is the job's occurrence id (its webhook-id).
    planned = select(*both.c, func.gen_random_uuid().label("event_id")).cte("planned_occurrence_events")
    return _insert_events(planned).cte("occurrence_events_written")


def trip_auto_pauses(applied: Any) -> Any:
    """Each auto-pausing target's run of failed attempts: a success in the batch ends it,
    failures extend it, and reaching auto_pause_failures pauses the target (pause_kind auto)
    and emits target.auto_paused. Only targets with auto_pause and with failures (or a run
    to end) are locked, in id order, so two batches never wait on each other in a cycle."""
    # Constants in the text, as state_in writes states: the statement is compiled once.
    outcome = applied.c.settled_outcome
    failed = outcome.in_([literal_column(f"'{failure.value}'") for failure in TARGET_FAILURES])
    streaks = (
        select(
            applied.c.target_id,
            func.bool_or(outcome == RunOutcome.SUCCESS.value).label("any_success"),
            func.count().filter(failed).label("failures"),
        )
        .group_by(applied.c.target_id)
        .cte("target_streaks")
    )
    before = targets.alias("before")
    locked = (
        select(
            before.c.id, before.c.paused_at, before.c.consecutive_failures, streaks.c.any_success, streaks.c.failures
        )
        .join(streaks, streaks.c.target_id == before.c.id)
        .where(
            before.c.auto_pause_failures.is_not(None),
            (streaks.c.failures > 0) | (before.c.consecutive_failures > 0),
        )
        .order_by(before.c.id)
        .with_for_update(of=before)
        .cte("target_streaks_locked")
    )
    run = case((locked.c.any_success, 0), else_=locked.c.consecutive_failures + locked.c.failures)
    trips = and_(locked.c.paused_at.is_(None), run >= targets.c.auto_pause_failures)
    reason = func.concat(literal("auto-paused after ", Text), run, literal(" failed attempts in a row", Text))
    paused = (
        update(targets)
        .where(targets.c.id == locked.c.id)
        .values(
            consecutive_failures=run,
            paused_at=case((trips, func.now()), else_=targets.c.paused_at),
            paused_until=case((trips, None), else_=targets.c.paused_until),
            pause_kind=case((trips, literal("auto", Text)), else_=targets.c.pause_kind),
            paused_reason=case((trips, reason), else_=targets.c.paused_reason),
            updated_at=func.now(),
        )
        .returning(
            targets.c.id,
            targets.c.tenant_id,
            targets.c.name,
            targets.c.paused_reason,
            targets.c.consecutive_failures,
            trips.label("tripped"),
        )
        .cte("auto_paused")
    )
    event_type = literal(EventType.TARGET_AUTO_PAUSED.value, Text)
    data = func.jsonb_build_object(
        *_pairs(
            target_id=paused.c.id,
            name=paused.c.name,
            reason=paused.c.paused_reason,
            kind=literal("auto", Text),
            paused_until=literal(None, Text),
            consecutive_failures=paused.c.consecutive_failures,
        )
    )
    planned = (
        select(
            paused.c.tenant_id,
            random_partition().label("partition"),
            event_type.label("event_type"),
            data.label("data"),
            event_subscriptions.c.target_id.label("dest"),
            func.gen_random_uuid().label("event_id"),
        )
        .join(event_subscriptions, _subscribed(paused.c.tenant_id, event_type))
        .where(paused.c.tripped)
        .cte("planned_auto_pause_events")
    )
    return _insert_events(planned).cte("auto_pause_events_written")


def _pairs(**values: Any) -> list[Any]:
    """jsonb_build_object's arguments: key, value, key, value..."""
    pairs: list[Any] = []
    for key, value in values.items():
        pairs += [literal(key, Text), value]
    return pairs
