"""Request and response models: XCreate / XUpdate / XPublic per resource.

Requests forbid unknown fields, so a typo is a 422 naming the field, not a silent default.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import uuid
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Generic, Literal, TypeVar
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    StrictInt,
    field_validator,
)

from app.domain.occurrences import IntervalMode, MisfirePolicy, OverlapPolicy
from app.domain.states import JobState
from app.settings import TARGET_TIMEOUT_CEILING_S
from app.store.pagination import encode_cursor

T = TypeVar("T")

# Headers cronhook sets itself, or that would break the request if a target overrode them.
RESERVED_HEADERS = frozenset(
    {
        "host",
        "content-type",
        "content-length",
        "transfer-encoding",
        "connection",
        "user-agent",
        "te",
        "upgrade",
    }
)
RESERVED_HEADER_PREFIXES = ("webhook-", "cronhook-")
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}$")
MAX_HEADERS = 32
MAX_URL_LENGTH = 2048
MAX_DELAY_S = 10 * 365 * 86400


class RequestModel(BaseModel):
    # Numbers and booleans are declared strict field by field (Field(strict=True)): lax mode
    # would take `true` as 1 and "5" as 5 (`"every_s": true` made a one-second job). A whole-
    # model strict mode would also refuse the ISO strings FastAPI hands over for datetimes and UUIDs.
    model_config = ConfigDict(extra="forbid")


def _is_storable_text(value: str) -> bool:
    """PostgreSQL text cannot hold NUL, and lone surrogates are not UTF-8."""
    if "\x00" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _plain_text(value: str) -> str:
    if not _is_storable_text(value) or any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise ValueError("must not contain control characters")
    return value


PlainText = Annotated[str, AfterValidator(_plain_text)]


def check_json_payload(value: Any, depth: int = 0) -> Any:
    """Rejects what JSON parsers accept but JSONB cannot store: NaN/Infinity, NUL, surrogates."""
    if depth > 64:
        raise ValueError("is nested more than 64 levels deep")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("must not contain NaN or Infinity")
    if isinstance(value, str) and not _is_storable_text(value):
        raise ValueError("strings must not contain NUL characters or unpaired surrogates")
    if isinstance(value, dict):
        for key, item in value.items():
            check_json_payload(key, depth + 1)
            check_json_payload(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            check_json_payload(item, depth + 1)
    return value


def _check_url(value: str) -> str:
    if len(value) > MAX_URL_LENGTH:
        raise ValueError(f"must be at most {MAX_URL_LENGTH} characters")
    if not value.isascii() or any(ord(c) <= 0x20 or ord(c) == 0x7F for c in value):
        raise ValueError("must be an ASCII URL without spaces or control characters (percent-encode them)")
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https"):
        raise ValueError("must be an http:// or https:// URL")
    if not parts.hostname:
        raise ValueError("must include a host")
    if parts.username or parts.password:
        # Credentials in the URL would be echoed by every read; use `headers` instead.
        raise ValueError("must not contain credentials; put them in `headers`")
    try:
        _ = parts.port
    except ValueError as exc:
        raise ValueError("has an invalid port") from exc
    return value


def _check_headers(value: dict[str, str] | None) -> dict[str, str] | None:
    if value is None:
        return None
    if len(value) > MAX_HEADERS:
        raise ValueError(f"at most {MAX_HEADERS} headers")
    seen: set[str] = set()
    for name, header_value in value.items():
        lower = name.lower()
        if not _HEADER_NAME.match(name):
            raise ValueError(f"{name!r} is not a valid header name")
        if lower == "expect":
            # `Expect: 100-continue` would make every delivery wait out its timeout.
            raise ValueError("'Expect' is not allowed on webhook requests")
        if lower in RESERVED_HEADERS or lower.startswith(RESERVED_HEADER_PREFIXES):
            raise ValueError(f"{name!r} is set by cronhook and cannot be overridden")
        if lower in seen:
            raise ValueError(f"{name!r} is given twice")
        seen.add(lower)
        # Visible ASCII, space and tab only: anything else cannot be sent on every client.
        if len(header_value) > 4096 or any(not (c == "\t" or " " <= c <= "~") for c in header_value):
            raise ValueError(f"the value of {name!r} must be visible ASCII (at most 4096 characters)")
    return value


def _check_statuses(value: list[int] | None) -> list[int] | None:
    if value is None:
        return None
    if len(value) > 100 or any(not 300 <= status <= 599 for status in value):
        raise ValueError("must list at most 100 statuses, each from 300 to 599")
    return sorted(set(value))


MaxInFlight = Annotated[
    int | None,
    Field(
        strict=True,
        ge=1,
        le=10_000,
        description="Deliveries to this target in flight at once, across all replicas; null = unlimited",
    ),
]
RatePerS = Annotated[
    float | None,
    Field(
        strict=True,
        # One delivery every 1,000 s at the slowest; smaller rates underflow the bucket's math.
        ge=0.001,
        le=10_000,
        description="Deliveries started per second across all replicas (token bucket, bursts of up to one "
        "second's worth); null = unlimited",
    ),
]

RetryStatuses = Annotated[
    list[StrictInt] | None,
    AfterValidator(_check_statuses),
    Field(
        description="Statuses to retry instead of the default (5xx, 408, 425, 429, 3xx); others dead-letter",
    ),
]


class TargetCreate(RequestModel):
    name: Annotated[PlainText, Field(min_length=1, max_length=200)]
    url: Annotated[
        str,
        Field(
            description="http(s) URL the webhooks are POSTed to. Loopback, private, link-local and other internal "
            "addresses are refused (422) unless the operator allows them in CRONHOOK_EGRESS_ALLOW"
        ),
    ]
    headers: dict[str, str] | None = Field(
        default=None, description="Extra request headers (e.g. Authorization); values are never returned"
    )
    timeout_s: Annotated[float | None, Field(strict=True, gt=0, le=TARGET_TIMEOUT_CEILING_S)] = Field(
        default=None, description="Total deadline of one delivery; default CRONHOOK_DEFAULT_TARGET_TIMEOUT_S"
    )
    retry_on_status: RetryStatuses = None
    max_in_flight: MaxInFlight = None
    rate_per_s: RatePerS = None

    _url = field_validator("url")(_check_url)
    _headers = field_validator("headers")(_check_headers)


class TargetUpdate(RequestModel):
    name: Annotated[PlainText | None, Field(min_length=1, max_length=200)] = None
    url: str | None = None
    headers: dict[str, str] | None = None
    timeout_s: Annotated[float | None, Field(strict=True, gt=0, le=TARGET_TIMEOUT_CEILING_S)] = None
    retry_on_status: RetryStatuses = None
    max_in_flight: MaxInFlight = None
    rate_per_s: RatePerS = None

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return None if value is None else _check_url(value)

    _headers = field_validator("headers")(_check_headers)


class TargetPublic(BaseModel):
    id: uuid.UUID
    name: str
    url: str
    headers: dict[str, str] = Field(description="Header names; values are redacted")
    timeout_s: float
    retry_on_status: list[int] | None
    max_in_flight: int | None
    rate_per_s: float | None
    created_at: dt.datetime
    updated_at: dt.datetime


class TargetWithSecret(TargetPublic):
    secret: str = Field(description="Signing secret (whsec_...); shown only on create and rotate")


class TargetSecret(BaseModel):
    id: uuid.UUID
    secret: str


class JobCreate(RequestModel):
    target_id: uuid.UUID
    payload: Annotated[JsonValue, AfterValidator(check_json_payload)] = Field(
        default=None, description="Any JSON; sent as the webhook body"
    )
    name: Annotated[PlainText | None, Field(max_length=200)] = None
    priority: Annotated[int, Field(strict=True, ge=0, le=9)] = 0
    max_attempts: Annotated[int | None, Field(strict=True, ge=1, le=100)] = None
    backoff_base_s: Annotated[float | None, Field(strict=True, gt=0, le=86400)] = None
    backoff_max_s: Annotated[float | None, Field(strict=True, gt=0, le=7 * 86400)] = None
    backoff_factor: Annotated[float | None, Field(strict=True, ge=1, le=10)] = None
    run_at: AwareDatetime | None = Field(default=None, description="RFC 3339 timestamp with offset")
    delay_s: Annotated[float | None, Field(strict=True, gt=0, le=MAX_DELAY_S)] = None
    cron: Annotated[PlainText | None, Field(min_length=1, max_length=200)] = None
    timezone: Annotated[PlainText | None, Field(min_length=1, max_length=64)] = Field(
        default=None, description="IANA time zone for `cron` (default UTC)"
    )
    every_s: Annotated[int | None, Field(strict=True, ge=1, le=366 * 86400)] = None
    dedup_key: Annotated[PlainText | None, Field(min_length=1, max_length=200)] = Field(
        default=None,
        description="Unique among this tenant's unfinished jobs: a second create with it is a 409 naming the job",
    )
    # Recurring jobs only (cron or every_s); defaults in README.
    interval_mode: IntervalMode | None = Field(
        default=None, description="every_s only: fixed_rate (default, anchored) or fixed_delay (after each run)"
    )
    misfire_policy: MisfirePolicy | None = Field(
        default=None, description="Late by more than misfire_grace_s: skip, fire_once (default) or catch_up"
    )
    misfire_grace_s: Annotated[float | None, Field(strict=True, ge=0, le=86_400)] = Field(
        default=None, description="A fire time at most this late still counts as on time (default 60)"
    )
    catch_up_limit: Annotated[int | None, Field(strict=True, ge=1, le=1000)] = Field(
        default=None, description="catch_up delivers at most this many missed occurrences of a backlog (default 10)"
    )
    overlap_policy: OverlapPolicy | None = Field(
        default=None,
        description="Fire times that come due while an occurrence is in flight: forbid (default: skipped) or allow "
        "(each fires on time; its delivery is carried by a one-off child job, see parent_job_id)",
    )
    start_at: AwareDatetime | None = Field(default=None, description="No fire time before this")
    end_at: AwareDatetime | None = Field(default=None, description="No fire time after this; then the job ends")
    max_runs: Annotated[int | None, Field(strict=True, ge=1, le=10**9)] = Field(
        default=None, description="End the job after this many delivered occurrences"
    )


class JobUpdate(JobCreate):
    """PATCH /v1/jobs/{id}: only the fields sent change. A new schedule (one of run_at,
    delay_s, cron [+ timezone], every_s) replaces the old one and recomputes the next fire time."""

    target_id: uuid.UUID | None = None  # type: ignore[assignment]


class JobPublic(BaseModel):
    id: uuid.UUID
    name: str | None
    target_id: uuid.UUID
    state: JobState
    payload: JsonValue
    priority: int
    schedule_kind: Literal["once", "cron", "interval"]
    cron: str | None
    timezone: str | None
    every_s: int | None
    dedup_key: str | None
    interval_mode: IntervalMode | None = Field(description="every_s jobs only")
    misfire_policy: MisfirePolicy | None = Field(description="Recurring jobs only")
    misfire_grace_s: float | None
    catch_up_limit: int | None
    overlap_policy: OverlapPolicy | None
    start_at: dt.datetime | None
    end_at: dt.datetime | None
    max_runs: int | None
    runs: int = Field(description="Occurrences delivered (succeeded or dead-lettered)")
    ended_reason: str | None = Field(description="Why a recurring job ended: max_runs, end_at or schedule")
    parent_job_id: uuid.UUID | None = Field(
        description="Set on a one-off job that carries an occurrence of a recurring job: a trigger, or an "
        "occurrence handed off under overlap_policy allow"
    )
    next_run_at: dt.datetime | None = Field(description="When the job next becomes due (fire time or retry)")
    scheduled_for: dt.datetime = Field(description="Nominal fire time of the current occurrence")
    attempt: int
    max_attempts: int
    backoff_base_s: float
    backoff_max_s: float
    backoff_factor: float
    last_status_code: int | None
    last_error: str | None
    created_at: dt.datetime
    updated_at: dt.datetime
    finished_at: dt.datetime | None


class RunPublic(BaseModel):
    id: int
    job_id: uuid.UUID = Field(
        description="The job that made the attempt: this job, or a child carrying one of its occurrences "
        "(a trigger, or any occurrence under overlap_policy allow)"
    )
    scheduled_for: dt.datetime
    attempt: int
    started_at: dt.datetime | None
    finished_at: dt.datetime
    status_code: int | None
    duration_ms: int | None
    outcome: Literal[
        "success", "http_error", "timeout", "connection_error", "lease_expired", "missed", "skipped_overlap"
    ] = Field(
        description="An attempt's result; `missed` (given up by the misfire policy) and `skipped_overlap` (came due "
        "while the previous occurrence was in flight) are fire times never delivered (attempt 0)"
    )
    error: str | None


class DeadLetterPublic(BaseModel):
    id: uuid.UUID
    job_id: uuid.UUID
    target_id: uuid.UUID
    scheduled_for: dt.datetime
    payload: JsonValue
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
    since: AwareDatetime | None = Field(default=None, description="created at or after")
    until: AwareDatetime | None = Field(default=None, description="created before")
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

    payload: Annotated[JsonValue, AfterValidator(check_json_payload)] = None
    target_id: uuid.UUID | None = None


class Page(BaseModel, Generic[T]):
    items: list[T]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last page")


def page_of(
    rows: Sequence[Any], limit: int, to_item: Callable[[Any], T], cursor_of: Callable[[Any], str] | None = None
) -> Page[T]:
    """`rows` were fetched with `limit + 1`: an extra row means there is a next page."""
    cursor_of = cursor_of or (lambda row: encode_cursor(row["created_at"], row["id"]))
    next_cursor = cursor_of(rows[limit - 1]) if len(rows) > limit else None
    return Page[T](items=[to_item(row) for row in rows[:limit]], next_cursor=next_cursor)


class Health(BaseModel):
    status: Literal["ok"]


class Readiness(BaseModel):
    status: Literal["ready", "unavailable"]
    database: bool
    schema_current: bool


class ClusterPartition(BaseModel):
    partition: int
    epoch: int = Field(description="Rises by one on every acquisition of the partition.")
    expires_at: dt.datetime


class ClusterReplica(BaseModel):
    id: str
    started_at: dt.datetime
    heartbeat_at: dt.datetime
    expires_at: dt.datetime
    partition_count: int
    partitions: list[ClusterPartition]
    oldest_due_at: dt.datetime | None = Field(
        description="The oldest due, unclaimed job in this replica's partitions; null when none is waiting."
    )
    lag_s: float = Field(description="Seconds since `oldest_due_at` (0 when nothing is waiting).")


class ClusterStatus(BaseModel):
    now: dt.datetime = Field(description="The database's clock, which every lease is measured against.")
    partition_count: int
    replicas: list[ClusterReplica]
    unowned_partitions: list[int] = Field(description="Partitions with no live owner (being taken over).")
    unowned_oldest_due_at: dt.datetime | None


def recurring(row: Any, column: str) -> Any:
    return None if row["schedule_kind"] == "once" else row[column]


def job_public(row: Any) -> JobPublic:
    return JobPublic(
        id=row["id"],
        name=row["name"],
        target_id=row["target_id"],
        state=row["state"],
        payload=row["payload"],
        priority=row["priority"],
        schedule_kind=row["schedule_kind"],
        cron=row["cron"],
        timezone=row["timezone"] if row["schedule_kind"] == "cron" else None,
        every_s=row["every_s"],
        dedup_key=row["dedup_key"],
        interval_mode=row["interval_mode"] if row["schedule_kind"] == "interval" else None,
        misfire_policy=recurring(row, "misfire_policy"),
        misfire_grace_s=recurring(row, "misfire_grace_s"),
        catch_up_limit=recurring(row, "catch_up_limit"),
        overlap_policy=recurring(row, "overlap_policy"),
        start_at=row["start_at"],
        end_at=row["end_at"],
        max_runs=row["max_runs"],
        runs=row["occurrences_run"],
        ended_reason=row["ended_reason"],
        parent_job_id=row["parent_job_id"],
        next_run_at=row["run_at"],
        scheduled_for=row["scheduled_for"],
        attempt=row["attempt"],
        max_attempts=row["max_attempts"],
        backoff_base_s=row["backoff_base_s"],
        backoff_max_s=row["backoff_max_s"],
        backoff_factor=row["backoff_factor"],
        last_status_code=row["last_status_code"],
        last_error=row["last_error"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        finished_at=row["finished_at"],
    )


REDACTED = "<redacted>"


def target_public(row: Any) -> TargetPublic:
    headers = dict.fromkeys(row["headers"] or {}, REDACTED)
    return TargetPublic(
        id=row["id"],
        name=row["name"],
        url=row["url"],
        headers=headers,
        timeout_s=row["timeout_s"],
        retry_on_status=row["retry_on_status"],
        max_in_flight=row["max_in_flight"],
        rate_per_s=row["rate_per_s"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )
