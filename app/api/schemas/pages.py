"""A page of a cursor-paginated list."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, Field

from app.store.pagination import encode_cursor

T = TypeVar("T")


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
