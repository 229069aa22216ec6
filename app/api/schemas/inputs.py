"""What every request model shares: unknown fields refused, numbers strict, and text and
JSON that PostgreSQL can store."""

from __future__ import annotations

import datetime as dt
import re
from typing import Annotated, Any

from pydantic import AfterValidator, AwareDatetime, BaseModel, BeforeValidator, ConfigDict

from app.domain.payload import check_json_payload, is_storable_text

__all__ = ["Labels", "PlainText", "RequestModel", "Timestamp", "check_json_payload", "label_filter"]


class RequestModel(BaseModel):
    # Numbers and booleans are declared strict field by field (Field(strict=True)): lax mode
    # would take `true` as 1 and "5" as 5 (`"every_s": true` made a one-second job). A whole-
    # model strict mode would also refuse the ISO strings FastAPI hands over for datetimes and UUIDs.
    model_config = ConfigDict(extra="forbid")


# The start of an RFC 3339 date-time (pydantic then parses and checks the rest).
_DATE_TIME_START = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]")


def _date_time_text(value: Any) -> Any:
    # Lax mode would also take a number, or a numeric string, as Unix time (`"run_at": 1767225600`,
    # `?since=0.77`): not what the published schema (a date-time string) allows.
    if isinstance(value, dt.datetime) or (isinstance(value, str) and _DATE_TIME_START.match(value)):
        return value
    raise ValueError("must be an RFC 3339 date-time with an offset, such as 2030-01-01T09:00:00Z")


# Every date-time a request carries, in a body or a query.
Timestamp = Annotated[AwareDatetime, BeforeValidator(_date_time_text)]


def _plain_text(value: str) -> str:
    if not is_storable_text(value) or any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise ValueError("must not contain control characters")
    return value


PlainText = Annotated[str, AfterValidator(_plain_text)]


# Labels on jobs and targets: a few short key/value pairs to find things by (`?label=team=payments`).
MAX_LABELS = 16
_LABEL_KEY = re.compile(r"[a-z0-9]([a-z0-9._/-]{0,61}[a-z0-9])?")
_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")


def _labels(value: dict[str, str]) -> dict[str, str]:
    if len(value) > MAX_LABELS:
        raise ValueError(f"at most {MAX_LABELS} labels")
    for key, text in value.items():
        if not _LABEL_KEY.fullmatch(key):
            raise ValueError(f"label key {key[:70]!r}: 1-63 of a-z 0-9 . _ / -, starting and ending alphanumeric")
        if text and not _LABEL_VALUE.fullmatch(text):
            raise ValueError(f"label {key!r}: values are 0-63 of A-Z a-z 0-9 . _ -, starting and ending alphanumeric")
    return value


Labels = Annotated[dict[str, str], AfterValidator(_labels)]


def label_filter(selectors: list[str] | None) -> dict[str, str] | None:
    """`?label=key=value` (repeatable: all must hold) as the labels a row must contain; a
    selector that is not key=value is a ValueError naming it."""
    if not selectors:
        return None
    wanted: dict[str, str] = {}
    for selector in selectors:
        key, sep, text = selector.partition("=")
        if not sep or not _LABEL_KEY.fullmatch(key):
            raise ValueError(f"label selector {selector[:80]!r}: give key=value, e.g. team=payments")
        # No stored label has another value (Labels above), and a NUL would fail in the database.
        if text and not _LABEL_VALUE.fullmatch(text):
            raise ValueError(f"label selector {selector[:80]!r}: values are 0-63 of A-Z a-z 0-9 . _ -")
        wanted[key] = text
    return wanted
