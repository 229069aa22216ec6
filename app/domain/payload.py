"""A job's payload and the text the service stores: the rules (a JSON value JSONB can hold,
text PostgreSQL can hold), the codec (compact JSON, what CRONHOOK_MAX_PAYLOAD_BYTES limits
and the database stores) and the size check. The API, the batch, the dead-letter replay and
the dispatcher all go through here; the store receives the encoded text."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import orjson

MAX_DEPTH = 64

# The fallback for what orjson refuses (integers past 64 bits, which JSON allows): the same
# compact, UTF-8 form.
_COMPACT_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


class PayloadError(ValueError):
    """A payload the service cannot store (raised inside request validation: pydantic turns
    it into a 422 naming the field)."""


@dataclass(frozen=True)
class PayloadTooLarge(Exception):
    size: int
    limit: int

    def __str__(self) -> str:
        return f"payload is {self.size} bytes; the limit is {self.limit} (CRONHOOK_MAX_PAYLOAD_BYTES)"


def is_storable_text(value: str) -> bool:
    """PostgreSQL text cannot hold NUL, and lone surrogates are not UTF-8."""
    if "\x00" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def storable_text(text: str, max_chars: int) -> str:
    """Text someone else controls (a receiver's response body), made safe for a PostgreSQL
    text column: NUL dropped, lone surrogates replaced, at most `max_chars` characters."""
    cleaned = text.replace("\x00", "").encode("utf-8", "replace").decode("utf-8")
    return cleaned[:max_chars]


def check_json_payload(value: Any, depth: int = 0) -> Any:
    """A JSON value that JSONB can store: JSON's types only (pydantic's JsonValue checked that
    too, at 3x the cost on a batch: bench/log/2026-11-23-baseline.md), and not what JSON parsers accept but
    JSONB refuses: NaN/Infinity, NUL, unpaired surrogates. Raises PayloadError."""
    if depth > MAX_DEPTH:
        raise PayloadError(f"is nested more than {MAX_DEPTH} levels deep")
    if isinstance(value, str):
        if not is_storable_text(value):
            raise PayloadError("strings must not contain NUL characters or unpaired surrogates")
    elif isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise PayloadError("object keys must be strings")
            check_json_payload(key, depth + 1)
            check_json_payload(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            check_json_payload(item, depth + 1)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise PayloadError("must not contain NaN or Infinity")
    elif value is not None and not isinstance(value, int):  # bool is an int
        raise PayloadError("must hold only JSON values")
    return value


def payload_json(payload: Any) -> str:
    """The payload as sent to the database: compact JSON in UTF-8 (orjson: a few times faster
    than the standard library's encoder on a typical payload)."""
    try:
        return orjson.dumps(payload).decode()
    except TypeError:
        # An integer past 64 bits (valid JSON, which check_json_payload lets through).
        return _COMPACT_JSON.encode(payload)


def payload_size(encoded: str) -> int:
    """The size CRONHOOK_MAX_PAYLOAD_BYTES limits: UTF-8 bytes of the compact JSON."""
    return len(encoded) if encoded.isascii() else len(encoded.encode())


def encode_within(payload: Any, limit: int) -> str:
    """The payload's stored text, if it is within `limit` bytes; else PayloadTooLarge."""
    encoded = payload_json(payload)
    size = payload_size(encoded)
    if size > limit:
        raise PayloadTooLarge(size, limit)
    return encoded
