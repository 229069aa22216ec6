"""What every request model shares: unknown fields refused, numbers strict, and text and
JSON that PostgreSQL can store."""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict


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
