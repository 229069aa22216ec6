"""Pause and resume: the bodies of POST /v1/targets/{id}/pause and /resume (and the admin's
tenant pause and resume), and what they answer."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

from pydantic import BaseModel, Field
from sqlalchemy.engine import RowMapping

from app.api.schemas.inputs import PlainText, RequestModel, Timestamp
from app.api.schemas.targets import TargetPublic
from app.domain.occurrences import OnResume

MAX_REASON_LENGTH = 500

Reason = Annotated[
    PlainText | None,
    Field(max_length=MAX_REASON_LENGTH, description="Why it is paused: shown on reads and in the events"),
]
Until = Annotated[
    Timestamp | None,
    Field(description="Resume by itself at this time (RFC 3339, in the future); null: until resumed"),
]


class PauseOptions(RequestModel):
    """A pause. Pausing what is paused already changes the fields sent (and only those)."""

    reason: Reason = None
    until: Until = None


class ResumeOptions(RequestModel):
    on_resume: OnResume = Field(
        default=OnResume.DELIVER_ALL,
        description="`deliver_all`: every held occurrence is delivered, due from the resume (its misfire grace "
        "counts from then). `misfire_policy`: each recurring job's held occurrence gets its own time back and its "
        "misfire policy applies as if it had not been held",
    )
    drain_rate_per_s: Annotated[float | None, Field(strict=True, ge=0.001, le=10_000)] = Field(
        default=None,
        description="Release the held occurrences at most this many per second, in their order (and at most at "
        "the target's own rate_per_s); null: all at once, at the target's rate_per_s if it has one",
    )


class TargetPaused(TargetPublic):
    """The target after a pause: with how many waiting occurrences this pause held."""

    held: int = Field(description="Waiting occurrences this request held (those held already not counted)")


class TargetResumed(TargetPublic):
    """The target after a resume: with how many held occurrences it released."""

    released: int = Field(description="Held occurrences released (0 while its tenant is paused)")


class TenantPause(BaseModel):
    """A tenant's pause, as an operator sees it."""

    tenant: str
    paused: bool
    paused_at: dt.datetime | None
    paused_until: dt.datetime | None
    paused_reason: str | None


class TenantPaused(TenantPause):
    held: int = Field(description="Waiting occurrences this request held")


class TenantResumed(TenantPause):
    released: int = Field(description="Held occurrences released (of the targets not paused themselves)")


def tenant_pause(row: RowMapping) -> dict[str, Any]:
    """A tenants row's pause, as TenantPause's fields."""
    return {
        "tenant": row["name"],
        "paused": row["paused_at"] is not None,
        "paused_at": row["paused_at"],
        "paused_until": row["paused_until"],
        "paused_reason": row["paused_reason"],
    }
