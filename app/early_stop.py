"""A service process's stop signals (SIGTERM, and Ctrl-C's SIGINT) outside its role's own
handlers: while it is still starting (imports, settings, the event loop's first steps),
before the role's handler is in place, and while it exits after its role has stopped
(`ignore_from_now`). It also keeps whether the process was told to stop (`record`), which a
parent reads to tell a child that stopped with it from one that left on its own.

The handler only records the stop; it never raises. An exception raised from a signal
handler lands wherever the main thread happens to be: inside an extension module's import
(pydantic-core's, through PyO3, turned it into a panic and exit 1; Python's own SIGINT
handler raises KeyboardInterrupt there too, with a traceback), inside a library's bare
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


# Both stop a role gracefully once it runs (app/runtime.py, uvicorn): a terminal's Ctrl-C
# reaches every process of `cronhook up`, its children too.
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})


def _on_stop_signal(signum: int, frame: FrameType | None) -> None:
    _requested.set()


def install() -> None:
    for sig in STOP_SIGNALS:
        signal.signal(sig, _on_stop_signal)


def requested() -> bool:
    """Whether this process was told to stop: while starting, or later (`record`)."""
    return _requested.is_set()


def record() -> None:
    """The role's own handler took a stop signal. Recorded here too, so a parent can tell a
    child that stopped with it (a terminal's Ctrl-C, or systemd stopping the service, signals
    every process of the group at once) from one that left on its own (app/processes.py)."""
    _requested.set()


def exit_if_requested() -> None:
    """Before an event loop starts: a stop that came meanwhile ends the process, exit 0.
    Nothing has started yet, so there is nothing to stop gracefully."""
    if _requested.is_set():
        raise SystemExit(0)


def ignore_from_now() -> None:
    """The role has stopped and the process is exiting: a stop signal that comes now (the
    parent's SIGTERM after a Ctrl-C that already reached this child) is ignored, and the
    process exits 0 as it was about to. Python's finalization resets a Python handler to the
    default, which would otherwise end the process with -15 part-way through its exit; an
    ignored signal it leaves ignored. Ignored, not blocked: a blocked signal still reaches
    the process through any other thread (the event loop's workers), where it is not blocked.
    The parent's SIGKILL after its grace period still ends an exit that hangs."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
