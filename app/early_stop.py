"""A SIGTERM that arrives while a service process is still starting (imports, settings, the
event loop's first steps), before the role's own handler is in place.

Before any event loop runs, the handler ends the process with exit 0 (nothing has started;
exit handlers run, the metrics directory is removed). Once a loop runs, raising from a signal
handler would break the loop mid-step (uvloop then fails to close with a traceback), so the
handler only records the stop; the role reads it as soon as its own handler is installed
(app/runtime.py run_role, app/serve.py) and stops as if the signal came then.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import warnings
from types import FrameType

_requested = threading.Event()


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        # A stop this early can land between creating the role's main coroutine and running
        # it: Python would then print "coroutine ... was never awaited" to stderr, a line that
        # is not a log event. Nothing was started, so there is nothing to warn about.
        warnings.filterwarnings("ignore", message="coroutine .* was never awaited", category=RuntimeWarning)
        raise SystemExit(0) from None
    _requested.set()


def install() -> None:
    signal.signal(signal.SIGTERM, _on_sigterm)


def requested() -> bool:
    """Whether a SIGTERM came while starting, after the event loop began running."""
    return _requested.is_set()
