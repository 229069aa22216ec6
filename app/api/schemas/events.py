"""Events (app/domain/events.py): a subscription's create and public models, and the body of
each event type's delivery, published under the OpenAPI document's `webhooks`
(app/api/contract_webhooks.py) so receivers can be generated from it."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from app.api.schemas.inputs import PlainText, RequestModel
from app.domain.events import MAX_SUBSCRIPTION_TYPES, EventType

# Subscriptions --------------------------------------------------------------------------------


class EventSubscriptionCreate(RequestModel):
    target_id: uuid.UUID = Field(description="The tenant's target each event is delivered to, signed with its secret")
    types: Annotated[
        list[EventType],
        Field(min_length=1, max_length=MAX_SUBSCRIPTION_TYPES, json_schema_extra={"uniqueItems": True}),
    ] = Field(description="The event types to deliver, each named once")
    description: Annotated[PlainText | None, Field(max_length=500)] = None


class EventSubscriptionPublic(BaseModel):
    id: uuid.UUID
    target_id: uuid.UUID
    types: list[EventType]
    description: str | None
    created_at: dt.datetime


# Event bodies ---------------------------------------------------------------------------------


class _Event(BaseModel):
    id: uuid.UUID = Field(
        description="The event's id: its delivery's webhook-id is `msg_<id without dashes>`, the same on every retry "
        "(deduplicate by it)"
    )
    type: str = Field(description="The event type")
    created_at: dt.datetime = Field(description="When the change it reports was made")
    tenant_id: uuid.UUID


class OccurrenceEventData(BaseModel):
    job_id: uuid.UUID = Field(description="The job whose occurrence settled")
    name: str | None
    schedule_key: str | None = Field(description="The job's schedule key (PUT /v1/schedules/{key}), if any")
    labels: dict[str, str]
    occurrence_id: uuid.UUID = Field(description="The occurrence: its deliveries' webhook-id is msg_<hex of it>")
    scheduled_for: dt.datetime
    attempts: int = Field(description="Attempts the occurrence took")
    outcome: str = Field(description="How its last attempt ended (a run's outcome: success, http_error, timeout...)")
    status_code: int | None = Field(description="Its last attempt's HTTP status, if it got one")
    error: str | None = Field(description="Its last attempt's error, if it failed")


class OccurrenceEvent(_Event):
    """An occurrence settled after its last attempt: succeeded, or dead-lettered. Sent to
    subscriptions, and to the job's on_success_target_id / on_failure_target_id."""

    type: Literal["occurrence.succeeded", "occurrence.dead_lettered"]
    data: OccurrenceEventData


class JobHealthEventData(BaseModel):
    job_id: uuid.UUID
    name: str | None
    schedule_key: str | None
    labels: dict[str, str]
    health: str = Field(description="The job's health now: `failing`, or `healthy` once recovered")
    consecutive_failures: int = Field(description="Occurrences failed (or missed) in a row")
    last_success_at: dt.datetime | None
    last_failure_at: dt.datetime | None
    last_error: str | None


class JobHealthEvent(_Event):
    """A recurring job's schedule started failing, or recovered: one of each per edge,
    never one per attempt."""

    type: Literal["job.health.failing", "job.health.recovered"]
    data: JobHealthEventData


class TargetPauseEventData(BaseModel):
    target_id: uuid.UUID
    name: str | None
    reason: str | None
    kind: Literal["manual", "auto"] = Field(description="`auto`: paused by its auto_pause after failed attempts")
    paused_until: dt.datetime | None = Field(description="When the pause ends by itself, if it does")
    consecutive_failures: int = Field(description="Failed attempts in a row across the target's jobs")


class TargetPauseEvent(_Event):
    """A target was paused (by hand, or by its auto_pause): its due occurrences are held."""

    type: Literal["target.paused", "target.auto_paused"]
    data: TargetPauseEventData


class TargetResumedEventData(TargetPauseEventData):
    released: int = Field(description="How many held occurrences the resume released")


class TargetResumedEvent(_Event):
    """A paused target was resumed: its held occurrences are released."""

    type: Literal["target.resumed"]
    data: TargetResumedEventData


class CheckEventData(BaseModel):
    check_id: uuid.UUID
    name: str
    status: str = Field(description="The check's status now: `down`, or `up` again")
    labels: dict[str, str]
    last_ping_at: dt.datetime | None
    last_ping_kind: Literal["success", "start", "fail"] | None
    next_due_at: dt.datetime | None = Field(description="When the next ping is (or was) expected")
    grace_s: int


class CheckEvent(_Event):
    """An inbound check went down (its ping is overdue past its grace, or a fail ping came),
    or came back up at a success ping."""

    type: Literal["check.down", "check.up"]
    data: CheckEventData


EventBody = type[_Event]

# The body of each event type's delivery.
EVENT_BODIES: dict[EventType, EventBody] = {
    EventType.OCCURRENCE_SUCCEEDED: OccurrenceEvent,
    EventType.OCCURRENCE_DEAD_LETTERED: OccurrenceEvent,
    EventType.JOB_HEALTH_FAILING: JobHealthEvent,
    EventType.JOB_HEALTH_RECOVERED: JobHealthEvent,
    EventType.TARGET_PAUSED: TargetPauseEvent,
    EventType.TARGET_AUTO_PAUSED: TargetPauseEvent,
    EventType.TARGET_RESUMED: TargetResumedEvent,
    EventType.CHECK_DOWN: CheckEvent,
    EventType.CHECK_UP: CheckEvent,
}
