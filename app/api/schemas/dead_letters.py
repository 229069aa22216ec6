"""Dead letters: public models, and what a replay (one, or in bulk) may ask for."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, Field, JsonValue

from app.api.schemas.inputs import RequestModel, Timestamp, check_json_payload
from app.api.schemas.jobs import RunPublic


class DeadLetterPublic(BaseModel):
    id: uuid.UUID
    job_id: uuid.UUID
    job_name: str | None = Field(description="The dead-lettered job's name, if it has one")
    target_id: uuid.UUID
    scheduled_for: dt.datetime
    payload: JsonValue = Field(description="In lists, null unless `include=payload`")
    attempts: int
    last_status_code: int | None
    last_error: str | None
    created_at: dt.datetime
    replayed_at: dt.datetime | None = Field(description="When it was last replayed")
    replay_job_id: uuid.UUID | None = Field(description="The job its latest replay created")


class DeadLetterDetail(DeadLetterPublic):
    runs: list[RunPublic] = Field(description="The attempts of the dead-lettered occurrence")


class DeadLetterBulkReplay(RequestModel):
    """Which dead letters to replay (all filters optional), how many, and how fast."""

    job_id: uuid.UUID | None = None
    target_id: uuid.UUID | None = None
    since: Timestamp | None = Field(default=None, description="created at or after")
    until: Timestamp | None = Field(default=None, description="created before")
    status_code: Annotated[int | None, Field(strict=True, ge=100, le=599, description="last HTTP status")] = None
    include_replayed: bool = Field(default=False, strict=True, description="also those replayed before")
    limit: Annotated[int, Field(strict=True, ge=1, le=1000)] = 100
    # At the slowest rate the largest batch (1,000) is spread over about 28 hours.
    rate_per_s: Annotated[float, Field(strict=True, ge=0.01, le=1000)] = Field(
        default=10.0, description="The replays fall due this many per second, oldest first"
    )


class ReplayedJob(BaseModel):
    dead_letter_id: uuid.UUID
    job_id: uuid.UUID
    next_run_at: dt.datetime


class BulkReplayResult(BaseModel):
    replayed: list[ReplayedJob]
    skipped_deleted_target: int = Field(description="Matching dead letters whose target was deleted")


class DeadLetterReplay(RequestModel):
    """Both optional: by default the replay goes to the same target with the same payload."""

    payload: Annotated[dict[str, Any] | None, AfterValidator(check_json_payload)] = None
    target_id: uuid.UUID | None = None
