"""Tables for people, JSON for scripts."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, TextIO


def render(data: Any, columns: Sequence[str], out: TextIO, as_json: bool) -> None:
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


def _text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)
