"""The `cronhook` executable. Client verbs (jobs, targets, dead-letters, audit, schedules) import
only the small HTTP client, and `health` only the standard library, so they start in a
fraction of the time the service roles need."""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import sys
import tempfile

CLIENT_VERBS = frozenset({"jobs", "targets", "dead-letters", "audit", "schedules", "apply", "diff", "export"})
# Roles that may run several processes (`--processes`, `--workers`) behind one /metrics.
SERVICE_ROLES = frozenset({"up", "api", "scheduler"})
# Long-running roles: a SIGTERM or SIGINT while one is still importing ends it with exit 0.
LONG_RUNNING_ROLES = SERVICE_ROLES | {"reaper"}
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def _share_metrics_between_processes() -> None:
    """Before prometheus_client is imported: a fresh directory where this process and every
    child it starts write their samples, so any of them serves the sum (app/metrics.py).
    The top process owns it and removes it at exit; children inherit the variable."""
    if os.environ.get(MULTIPROC_ENV):
        return
    directory = tempfile.mkdtemp(prefix="cronhook-metrics-")
    os.environ[MULTIPROC_ENV] = directory
    atexit.register(shutil.rmtree, directory, ignore_errors=True)


def _stop_cleanly_while_starting() -> None:
    """A SIGTERM (or a Ctrl-C) that arrives while a service process is still starting
    (imports: seconds on a busy machine) ends it with exit 0, as one that arrives later
    does, instead of killing it with 143 (or a KeyboardInterrupt's traceback) (app/early_stop.py)."""
    from app import early_stop

    early_stop.install()


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in CLIENT_VERBS:
        from app.client.commands import client_main

        raise SystemExit(client_main(args))
    if args and args[0] == "health":
        from app.health_check import main as health_main

        raise SystemExit(health_main(args[1:]))
    if args and args[0] in SERVICE_ROLES:
        _share_metrics_between_processes()
    if args and args[0] in LONG_RUNNING_ROLES:
        _stop_cleanly_while_starting()
    from app.early_stop import STOP_SIGNALS  # the standard library only

    # A child of `--processes`/`--workers` starts with the stop signals blocked
    # (app/processes.py): one that came meanwhile is delivered now, to the handler above.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    from app.cli import main as service_main

    service_main(args)
