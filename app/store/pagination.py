"""Keyset pagination over (created_at, id) or (id): opaque cursors for list endpoints."""

from __future__ import annotations

import base64
import datetime as dt
import json
import uuid
from typing import Any

from app.domain.payload import is_storable_text

# Cursors are opaque but come from clients: keep them within what PostgreSQL can compare.
MIN_TIME = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
MAX_TIME = dt.datetime(9999, 1, 1, tzinfo=dt.UTC)


class InvalidCursor(ValueError):
    pass


def encode_cursor(*parts: Any) -> str:
    raw = json.dumps([p.isoformat() if isinstance(p, dt.datetime) else str(p) for p in parts])
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_time_id_cursor(cursor: str) -> tuple[dt.datetime, uuid.UUID]:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        created_text, ident = json.loads(base64.urlsafe_b64decode(padded))
        parsed = dt.datetime.fromisoformat(created_text)
        if parsed.tzinfo is None:
            raise ValueError("cursor time without offset")
        created = parsed.astimezone(dt.UTC)
        if not MIN_TIME <= created <= MAX_TIME:
            raise ValueError("cursor time out of range")
        if not isinstance(ident, str):
            raise TypeError("cursor id must be a string")
        return created, uuid.UUID(ident)
    except (ValueError, TypeError, OverflowError) as exc:
        raise InvalidCursor("invalid cursor") from exc


def decode_int_cursor(cursor: str) -> int:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        (value,) = json.loads(base64.urlsafe_b64decode(padded))
        number = int(value)
        if not 0 <= number < 2**63:
            raise ValueError("cursor out of range")
        return number
    except (ValueError, TypeError, OverflowError) as exc:
        raise InvalidCursor("invalid cursor") from exc


def decode_text_cursor(cursor: str) -> str:
    """A cursor holding one text value (a key): encode_cursor(key)."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        (value,) = json.loads(base64.urlsafe_b64decode(padded))
        # A key is storable text: a NUL (PostgreSQL text cannot hold it) would make the
        # comparison fail in the database instead of here.
        if not isinstance(value, str) or not is_storable_text(value):
            raise TypeError("cursor value must be a key")
        return value
    except (ValueError, TypeError) as exc:
        raise InvalidCursor("invalid cursor") from exc
