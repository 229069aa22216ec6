"""Inbound check-ins (app/domain/check_ins.py): create and update models, the public check
(with its ping URL on create and token rotation only), its pings, and a ping's answer."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Annotated

from pydantic import BaseModel, Field

from app.api.schemas.inputs import Labels, PlainText, RequestModel
from app.domain.check_ins import MAX_EVERY_S, MAX_GRACE_S, CheckStatus, PingKind

CheckName = Annotated[PlainText, Field(min_length=1, max_length=200)]
EverySeconds = Annotated[int, Field(strict=True, ge=1, le=MAX_EVERY_S)]
GraceSeconds = Annotated[int, Field(strict=True, ge=0, le=MAX_GRACE_S)]
CronText = Annotated[PlainText, Field(min_length=1, max_length=200)]
TimezoneName = Annotated[PlainText, Field(min_length=1, max_length=64)]


class CheckCreate(RequestModel):
    """A check expects a ping every `every_s` seconds, or at each fire time of `cron` in
    `timezone`; it goes down when a ping is `grace_s` seconds late."""

    name: CheckName
    every_s: EverySeconds | None = Field(
        default=None, description="A ping is due this many seconds after the last one (or `cron`)"
    )
    cron: CronText | None = Field(
        default=None,
        description="A ping is due at each fire time of this expression after the last ping (or `every_s`)",
    )
    timezone: TimezoneName | None = Field(default=None, description="The cron expression's IANA zone (UTC if left out)")
    grace_s: GraceSeconds = Field(description="How late a ping may be (and how long a started run may take)")
    labels: Labels | None = None


class CheckUpdate(RequestModel):
    """Fields left out are unchanged. `every_s` or `cron` replaces the schedule; `timezone`
    alone changes a cron schedule's zone. The deadlines follow from the last ping (or the
    check's creation) under the new schedule and grace."""

    name: CheckName | None = None
    every_s: EverySeconds | None = None
    cron: CronText | None = None
    timezone: TimezoneName | None = None
    grace_s: GraceSeconds | None = None
    labels: Labels | None = None


class CheckPublic(BaseModel):
    id: uuid.UUID
    name: str
    every_s: int | None
    cron: str | None
    timezone: str
    grace_s: int
    status: CheckStatus = Field(
        description="`new` (never pinged), `up`, `started` (a run began and has not ended) or `down`"
    )
    last_ping_at: dt.datetime | None
    last_ping_kind: PingKind | None
    last_started_at: dt.datetime | None = Field(description="When the run under way began (a /start ping)")
    next_due_at: dt.datetime | None = Field(description="When the next ping is expected")
    alert_at: dt.datetime | None = Field(description="When the check goes down without a ping")
    labels: dict[str, str]
    created_at: dt.datetime
    updated_at: dt.datetime


class CheckWithPingUrl(CheckPublic):
    ping_url: str = Field(
        description="POST (or GET) here, with no API key; `/start` and `/fail` appended for those pings. "
        "Shown only now: keep it secret, and rotate it (POST /v1/checks/{id}/rotate-token) if it leaks"
    )


class CheckPingUrl(BaseModel):
    id: uuid.UUID
    ping_url: str = Field(description="The new ping URL; the previous one stopped working")


class CheckPingPublic(BaseModel):
    id: int
    kind: PingKind
    received_at: dt.datetime
    remote_addr: str | None
    body: str | None = Field(description="The ping's body, its first 1,000 characters")
    duration_ms: int | None = Field(description="A success or fail ping after a start ping: how long the run took")


class PingAnswer(BaseModel):
    status: CheckStatus
    next_due_at: dt.datetime | None = Field(description="When the next ping is expected")
    alert_at: dt.datetime | None = Field(description="When the check goes down without another ping")
