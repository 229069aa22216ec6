"""Keyset pagination over (created_at, id) or (id): opaque cursors for list endpoints."""

from __future__ import annotations

import base64
import datetime as dt
import json
import uuid
from typing import Any


class InvalidCursor(ValueError):
    pass


def encode_cursor(*parts: Any) -> str:
    raw = json.dumps([p.isoformat() if isinstance(p, dt.datetime) else str(p) for p in parts])
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_time_id_cursor(cursor: str) -> tuple[dt.datetime, uuid.UUID]:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        created, ident = json.loads(base64.urlsafe_b64decode(padded))
        return dt.datetime.fromisoformat(created), uuid.UUID(ident)
    except (ValueError, TypeError) as exc:
        raise InvalidCursor("invalid cursor") from exc


def decode_int_cursor(cursor: str) -> int:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        (value,) = json.loads(base64.urlsafe_b64decode(padded))
        return int(value)
    except (ValueError, TypeError) as exc:
        raise InvalidCursor("invalid cursor") from exc
