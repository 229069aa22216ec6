"""Tables for people, JSON for scripts; a list cut short says so on stderr, and a reader that
goes away (`| head`) ends the command quietly."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from app.client.http import Listing


def render(data: Any, columns: Sequence[str], out: TextIO, as_json: bool) -> None:
    if isinstance(data, Listing):
        _render_listing(data, columns, out, as_json)
        return
    if as_json:
        out.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
        return
    rows = data if isinstance(data, list) else [data]
    if not isinstance(data, list):
        # One object: field per line, the way `kubectl describe` reads.
        width = max((len(c) for c in columns), default=0)
        for column in columns:
            out.write(f"{column:<{width}}  {_text(data.get(column))}\n")
        return
    table = [list(columns)] + [[_text(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(columns))]
    for i, row in enumerate(table):
        out.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() + "\n")
        if i == 0:
            out.write("  ".join("-" * w for w in widths) + "\n")


def _render_listing(listing: Listing, columns: Sequence[str], out: TextIO, as_json: bool) -> None:
    """JSON: the page object itself (items and next_cursor), so a script can go on. A table:
    the items, and a line on stderr when there are more."""
    if as_json:
        render({"items": listing.items, "next_cursor": listing.next_cursor}, columns, out, as_json=True)
    else:
        render(listing.items, columns, out, as_json=False)
    if listing.next_cursor:
        out.flush()
        sys.stderr.write(f"cronhook: showing {len(listing.items)}; more with --cursor {listing.next_cursor}\n")


def stdout_closed() -> None:
    """After a BrokenPipeError on stdout (its reader, e.g. `head`, is done): point stdout at
    /dev/null, so the flush at exit does not fail a second time (Python's documented recipe)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def _text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)
