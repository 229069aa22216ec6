"""Reports on an asynchronous attempt (app/domain/completion.py): a heartbeat, the outcome."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field, JsonValue

from app.api.schemas.inputs import PlainText, RequestModel
from app.domain.completion import (
    MAX_PROGRESS_MESSAGE_CHARS,
    MAX_REPORT_ERROR_CHARS,
    MAX_REPORT_RETRY_AFTER_S,
    MAX_RESULT_BYTES,
    ReportOutcome,
)
from app.domain.payload import PayloadError, check_json_payload, is_storable_text


def _storable(value: str | None) -> str | None:
    if value is not None and not is_storable_text(value):
        raise PayloadError("must not contain NUL characters or unpaired surrogates")
    return value


class HeartbeatReport(RequestModel):
    progress: Annotated[int | None, Field(strict=True, ge=0, le=100)] = Field(
        default=None, description="How far the work has come, 0-100 (shown on the job and its run)"
    )
    message: Annotated[PlainText | None, Field(max_length=MAX_PROGRESS_MESSAGE_CHARS)] = Field(
        default=None, description="What the work is doing now"
    )


class CompletionReport(RequestModel):
    outcome: ReportOutcome = Field(
        description="`succeeded`; `failed`: failed for good (no retry: a one-off job is dead-lettered); "
        "`retry`: failed, try again under the job's retry policy"
    )
    error: Annotated[str | None, Field(max_length=MAX_REPORT_ERROR_CHARS), AfterValidator(_storable)] = Field(
        default=None, description="Why it failed (kept as the run's error)"
    )
    retry_after_s: Annotated[float | None, Field(strict=True, ge=0, le=MAX_REPORT_RETRY_AFTER_S)] = Field(
        default=None,
        description="`retry`: wait at least this long before the next attempt (the backoff applies if longer)",
    )
    result: Annotated[JsonValue, AfterValidator(check_json_payload)] = Field(
        default=None,
        description=f"Any JSON value, at most {MAX_RESULT_BYTES // 1024} KiB: kept on the run "
        "(GET /v1/jobs/{id}/runs)",
    )
