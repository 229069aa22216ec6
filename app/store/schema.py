"""The whole schema's MetaData, every table module imported: what migrations and the
schema test compare against."""

from __future__ import annotations

import app.store.tables_watch  # noqa: F401  (defines its tables on the shared MetaData)
from app.store.tables import metadata

__all__ = ["metadata"]
