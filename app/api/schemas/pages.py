"""A page of a cursor-paginated list."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Annotated, Any, Generic, Literal, TypeVar

from fastapi import Query
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


# Payloads in one list page at most (their JSON text; a page holds at least one item), so
# concurrent lists of large payloads cannot exhaust the API's memory.
PAGE_PAYLOAD_BUDGET = 1024 * 1024

IncludePayload = Annotated[
    Literal["payload"] | None,
    Query(description="`payload`: return each item's payload (pages then stop at about 1 MiB of payloads)"),
]


def rows_within_budget(rows: list[Any], limit: int) -> tuple[list[Any], int]:
    """`rows` (fetched with `limit + 1`, each with `payload_bytes`) and a limit cut to the
    rows whose payloads fit PAGE_PAYLOAD_BUDGET; `page_of` then gives the next cursor."""
    total = 0
    for index, row in enumerate(rows[:limit]):
        total += row["payload_bytes"] or 0
        if total > PAGE_PAYLOAD_BUDGET and index > 0:
            return rows, index
    return rows, limit
