"""What every request model shares: unknown fields refused, numbers strict, and text and
JSON that PostgreSQL can store."""

from __future__ import annotations

import datetime as dt
import math
import re
from typing import Annotated, Any

from pydantic import AfterValidator, AwareDatetime, BaseModel, BeforeValidator, ConfigDict


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
    """A JSON value that JSONB can store: JSON's types only (pydantic's JsonValue checked that
    too, at 3x the cost on a batch: bench/README.md), and not what JSON parsers accept but
    JSONB refuses: NaN/Infinity, NUL, unpaired surrogates."""
    if depth > 64:
        raise ValueError("is nested more than 64 levels deep")
    if isinstance(value, str):
        if not _is_storable_text(value):
            raise ValueError("strings must not contain NUL characters or unpaired surrogates")
    elif isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError("object keys must be strings")
            check_json_payload(key, depth + 1)
            check_json_payload(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            check_json_payload(item, depth + 1)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("must not contain NaN or Infinity")
    elif value is not None and not isinstance(value, int):  # bool is an int
        raise ValueError("must hold only JSON values")
    return value
