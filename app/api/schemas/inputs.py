"""What every request model shares: unknown fields refused, numbers strict, and text and
JSON that PostgreSQL can store."""

from __future__ import annotations

import datetime as dt
import re
from typing import Annotated, Any

from pydantic import AfterValidator, AwareDatetime, BaseModel, BeforeValidator, ConfigDict

from app.domain.payload import check_json_payload, is_storable_text

__all__ = ["PlainText", "RequestModel", "Timestamp", "check_json_payload"]


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
