"""The event loop the CLI roles run on: uvloop where it is installed (Linux, macOS), else
asyncio's own. uvloop's transports and timers cost about half of asyncio's pure-Python
selector loop per delivery (bench/log/2026-11-23-scheduler-work.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    try:
        import uvloop
    except ImportError:  # optional: Windows, or an install without it
        return asyncio.run(main)
    return uvloop.run(main)
