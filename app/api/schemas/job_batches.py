"""POST /v1/jobs/batch: up to BATCH_MAX_JOBS job creates in one request, and the per-item
results (created, or a dedup_key conflict naming the job that holds the key)."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from app.api.schemas.inputs import RequestModel
from app.api.schemas.jobs import JobCreate

BATCH_MAX_JOBS = 1000


class JobBatchCreate(RequestModel):
    jobs: Annotated[list[JobCreate], Field(min_length=1, max_length=BATCH_MAX_JOBS)] = Field(
        description=f"1 to {BATCH_MAX_JOBS} jobs, each as the body of POST /v1/jobs. Validated all or nothing: "
        "one invalid job (a 422 naming `jobs[i].field`) creates none"
    )


class JobBatchItemProblem(BaseModel):
    """Why this item was not created (RFC 9457 members, per item)."""

    type: str
    title: str
    status: int
    detail: str
    field: str = Field(description="`jobs[i].dedup_key`")
    job_id: uuid.UUID = Field(description="The unfinished job that holds the dedup_key")


class JobBatchItem(BaseModel):
    index: int = Field(description="Position of the job in the request's `jobs`")
    status: Literal[201, 409] = Field(description="201: created; 409: not created, its dedup_key is taken")
    id: uuid.UUID | None = Field(description="The new job (201)")
    next_run_at: dt.datetime | None = Field(description="When the new job first becomes due (201)")
    problem: JobBatchItemProblem | None = Field(description="Why it was not created (409)")


class JobBatchResult(BaseModel):
    created: int
    conflicts: int = Field(description="Items not created because of their dedup_key")
    items: list[JobBatchItem] = Field(description="One per job of the request, in its order")
