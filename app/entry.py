"""The `cronhook` executable. Client verbs (jobs, targets, dead-letters, schedules) import
only the small HTTP client, so they start in a fraction of the time the service roles need."""

from __future__ import annotations

import sys

CLIENT_VERBS = frozenset({"jobs", "targets", "dead-letters", "schedules"})


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in CLIENT_VERBS:
        from app.client.commands import client_main

        raise SystemExit(client_main(args))
    from app.cli import main as service_main

    service_main(args)
