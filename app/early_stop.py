"""A SIGTERM that arrives while a service process is still starting (imports, settings, the
event loop's first steps), before the role's own handler is in place.

The handler only records the stop; it never raises. An exception raised from a signal
handler lands wherever the main thread happens to be: inside an extension module's import
(pydantic-core's, through PyO3, turned it into a panic and exit 1), inside a library's bare
`except:` (which swallows it, so the process starts anyway and ignores the stop until it is
killed), or mid-step in a running loop (uvloop then fails to close with a traceback). The
recorded stop is acted on at fixed points instead: before an event loop starts
(`exit_if_requested`, exit 0 with exit handlers run, so the metrics directory is removed),
and once a loop runs, as soon as the role's own handler is installed (app/runtime.py
run_role, app/serve.py), as if the signal came then.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

_requested = threading.Event()


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    _requested.set()


def install() -> None:
    signal.signal(signal.SIGTERM, _on_sigterm)


def requested() -> bool:
    """Whether a SIGTERM came while starting, before the role's own handler was in place."""
    return _requested.is_set()


def exit_if_requested() -> None:
    """Before an event loop starts: a stop that came meanwhile ends the process, exit 0.
    Nothing has started yet, so there is nothing to stop gracefully."""
    if _requested.is_set():
        raise SystemExit(0)
