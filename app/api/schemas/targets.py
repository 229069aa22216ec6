"""Targets: create, update, put-by-name and public models, and what a target's URL and headers may be."""

from __future__ import annotations

import datetime as dt
import enum
import re
import uuid
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, Field, StrictInt, field_validator, model_validator
from pydantic_core import PydanticCustomError

from app.api.schemas.inputs import Labels, PlainText, RequestModel
from app.domain.completion import (
    DEFAULT_ASYNC_TIMEOUT_S,
    MAX_ASYNC_TIMEOUT_S,
    MIN_TIMEOUT_S,
    CompletionMode,
    heartbeat_fits,
)
from app.settings import TARGET_TIMEOUT_CEILING_S

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


Completion = Annotated[
    CompletionMode | None,
    Field(
        description="`sync` (default): an attempt ends with the receiver's answer. `async`: a `202 Accepted` "
        "leaves the attempt open until the receiver reports on the request's `cronhook-completion-url` "
        "(POST /v1/completions/{token}), or a deadline passes"
    ),
]
AsyncTimeout = Annotated[
    int | None,
    Field(
        strict=True,
        ge=MIN_TIMEOUT_S,
        le=MAX_ASYNC_TIMEOUT_S,
        description="Async attempts: the longest an attempt may run, from its delivery to the receiver's report "
        f"(default {DEFAULT_ASYNC_TIMEOUT_S} s, at most 7 days); then it fails (`async_timeout`) and is retried",
    ),
]
HeartbeatTimeout = Annotated[
    int | None,
    Field(
        strict=True,
        ge=MIN_TIMEOUT_S,
        le=MAX_ASYNC_TIMEOUT_S,
        description="Async attempts: fail an attempt early (`heartbeat_timeout`) when its receiver has not "
        "reported (202, heartbeat) for this long; null = no heartbeat needed",
    ),
]
AsyncCountsInFlight = Annotated[
    bool | None,
    Field(
        strict=True,
        description="Whether open async attempts count against max_in_flight until they finish (default true)",
    ),
]


class AutoPause(RequestModel):
    """Pause the target (pause_kind `auto`, event target.auto_paused) after this many failed
    attempts in a row across its jobs; a resume starts the count again."""

    consecutive_failures: Annotated[int, Field(strict=True, ge=1, le=10_000)]


AutoPauseField = Annotated[
    AutoPause | None,
    Field(
        description="Pause the target after `consecutive_failures` failed attempts in a row across its jobs "
        "(receiver errors, timeouts, connection errors); null: never"
    ),
]


def check_async_timeouts(async_timeout_s: int | None, heartbeat_timeout_s: int | None) -> None:
    """A heartbeat timeout longer than the attempt's own could never fire: refused."""
    if not heartbeat_fits(async_timeout_s, heartbeat_timeout_s):
        raise PydanticCustomError("heartbeat_too_long", "heartbeat_timeout_s must not exceed async_timeout_s")


class PauseKind(enum.StrEnum):
    MANUAL = "manual"
    AUTO = "auto"


# A target's name: free text, not unique (PUT /v1/targets/by-name/{name} refuses an ambiguous one).
TargetName = Annotated[PlainText, Field(min_length=1, max_length=200)]


class TargetDefinition(RequestModel):
    """What a target is, but its name: the body of PUT /v1/targets/by-name/{name}, which takes
    the name from its path and, like a create, the defaults for what it leaves out."""

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
    completion: Completion = None
    async_timeout_s: AsyncTimeout = None
    heartbeat_timeout_s: HeartbeatTimeout = None
    async_counts_in_flight: AsyncCountsInFlight = None
    labels: Labels | None = Field(default=None, description="Up to 16 key/value pairs to find the target by")
    auto_pause: AutoPauseField = None

    _url = field_validator("url")(_check_url)
    _headers = field_validator("headers")(_check_headers)

    @model_validator(mode="after")
    def _timeouts(self) -> TargetDefinition:
        check_async_timeouts(self.async_timeout_s or DEFAULT_ASYNC_TIMEOUT_S, self.heartbeat_timeout_s)
        return self


class TargetCreate(TargetDefinition):
    name: TargetName


class TargetUpdate(RequestModel):
    name: Annotated[PlainText | None, Field(min_length=1, max_length=200)] = None
    url: str | None = None
    headers: dict[str, str] | None = None
    timeout_s: Annotated[float | None, Field(strict=True, gt=0, le=TARGET_TIMEOUT_CEILING_S)] = None
    retry_on_status: RetryStatuses = None
    max_in_flight: MaxInFlight = None
    rate_per_s: RatePerS = None
    completion: Completion = None
    async_timeout_s: AsyncTimeout = None
    heartbeat_timeout_s: HeartbeatTimeout = None
    async_counts_in_flight: AsyncCountsInFlight = None
    labels: Labels | None = None
    auto_pause: AutoPauseField = None

    @model_validator(mode="after")
    def _timeouts(self) -> TargetUpdate:
        check_async_timeouts(self.async_timeout_s, self.heartbeat_timeout_s)
        return self

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return None if value is None else _check_url(value)

    _headers = field_validator("headers")(_check_headers)


class TargetPublic(BaseModel):
    id: uuid.UUID
    name: str
    labels: dict[str, str] = Field(description="Key/value pairs to find the target by")
    url: str
    headers: dict[str, str] = Field(description="Header names; values are redacted")
    timeout_s: float
    retry_on_status: list[int] | None
    max_in_flight: int | None
    rate_per_s: float | None
    completion: CompletionMode
    async_timeout_s: int | None
    heartbeat_timeout_s: int | None
    async_counts_in_flight: bool
    # Defaults: a create's response stored for an Idempotency-Key before these existed still reads.
    paused: bool = Field(default=False, description="Paused: its occurrences are held until it is resumed")
    paused_at: dt.datetime | None = Field(default=None, description="When this target was paused")
    paused_until: dt.datetime | None = Field(default=None, description="When its pause ends by itself")
    paused_reason: str | None = None
    pause_kind: PauseKind | None = Field(
        default=None, description="`manual` (POST /v1/targets/{id}/pause) or `auto` (its auto_pause tripped)"
    )
    auto_pause: AutoPause | None = None
    consecutive_failures: int = Field(
        default=0, description="Failed attempts in a row across its jobs (counted while auto_pause is set)"
    )
    created_at: dt.datetime
    updated_at: dt.datetime


class TargetWithSecret(TargetPublic):
    secret: str = Field(description="Signing secret (whsec_...); shown only on create and rotate")


class NamedTarget(TargetPublic):
    """A named target after a PUT: the target, and what the PUT changed."""

    changed: list[str] = Field(
        description="The fields the PUT changed: all it set for a new target, none when it matched already"
    )


class NamedTargetWithSecret(NamedTarget):
    """A named target the PUT created: with its signing secret, shown this once."""

    secret: str = Field(description="Signing secret (whsec_...); shown only on create and rotate")


# A rotation's previous secret signs at most this long alongside the new one.
MAX_ROTATION_GRACE_S = 7 * 86_400


class TargetRotate(RequestModel):
    grace_s: Annotated[float, Field(strict=True, ge=0, le=MAX_ROTATION_GRACE_S)] = Field(
        default=86_400,
        description="Seconds the previous secret keeps signing alongside the new one (0: stop at once)",
    )


class TargetSecret(BaseModel):
    id: uuid.UUID
    secret: str


REDACTED = "<redacted>"


def target_public(row: Any) -> TargetPublic:
    headers = dict.fromkeys(row["headers"] or {}, REDACTED)
    return TargetPublic(
        id=row["id"],
        name=row["name"],
        labels=row["labels"],
        url=row["url"],
        headers=headers,
        timeout_s=row["timeout_s"],
        retry_on_status=row["retry_on_status"],
        max_in_flight=row["max_in_flight"],
        rate_per_s=row["rate_per_s"],
        completion=row["completion"],
        async_timeout_s=row["async_timeout_s"],
        heartbeat_timeout_s=row["heartbeat_timeout_s"],
        async_counts_in_flight=row["async_counts_in_flight"],
        paused=row["paused_at"] is not None,
        paused_at=row["paused_at"],
        paused_until=row["paused_until"],
        paused_reason=row["paused_reason"],
        pause_kind=row["pause_kind"],
        auto_pause=auto_pause_of(row["auto_pause_failures"]),
        consecutive_failures=row["consecutive_failures"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


def auto_pause_of(failures: int | None) -> AutoPause | None:
    """The auto_pause a target's auto_pause_failures column stands for."""
    return None if failures is None else AutoPause(consecutive_failures=failures)
