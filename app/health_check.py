"""`cronhook health [--ready] [--server URL]`: the container health check, and a user's "is
my server up?". It asks the server named by `--server` (or `--url`), else CRONHOOK_URL, as
every client verb does; with neither, the local role (CRONHOOK_METRICS_PORT, else
CRONHOOK_PORT). Standard library only, and reached before the service's imports
(app/entry.py), so a check every few seconds costs a few milliseconds of CPU instead of the
second the service roles need to start."""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request

TIMEOUT_S = 4.0
EXIT_STATUS = """exit status:
  0  healthy: the server answered 200
  1  unhealthy: it answered otherwise, or not at all (the line says which, and names the server)
  2  usage"""


def default_url(environ: dict[str, str] | os._Environ[str]) -> str:
    """The server a user named (CRONHOOK_URL), else the local role's probe address:
    CRONHOOK_METRICS_PORT (scheduler, reaper), else the API's CRONHOOK_PORT."""
    named = environ.get("CRONHOOK_URL", "").strip()
    if named:
        return named
    metrics_port = environ.get("CRONHOOK_METRICS_PORT", "").strip()
    port = metrics_port if metrics_port not in ("", "0") else environ.get("CRONHOOK_PORT", "8080").strip()
    return f"http://127.0.0.1:{port}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--server",
        "--url",
        dest="url",
        help="default: CRONHOOK_URL, else http://127.0.0.1:<CRONHOOK_METRICS_PORT, else CRONHOOK_PORT>",
    )
    parser.add_argument(
        "--ready", action="store_true", help="ask /readyz instead: the process reaches and commits to the database"
    )


def check(url: str, ready: bool) -> int:
    """0 when the probe answers 200; else 1 (unhealthy, as container health checks expect,
    whether it answered otherwise or not at all), with one line on stderr naming the server
    and saying why."""
    probe = f"{url.rstrip('/')}/{'readyz' if ready else 'healthz'}"
    try:
        with urllib.request.urlopen(probe, timeout=TIMEOUT_S) as answer:
            if answer.status == 200:
                return 0
            status, body = answer.status, answer.read(4096)
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read(4096)
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        print(f"cronhook: {url} is not answering: {type(reason).__name__}", file=sys.stderr)  # noqa: T201
        return 1
    print(f"cronhook: {url} answers {status}: {_reason(body)}", file=sys.stderr)  # noqa: T201
    return 1


def _reason(body: bytes) -> str:
    """A probe's `reason` field, or the start of its body."""
    try:
        return str(json.loads(body)["reason"])
    except (ValueError, KeyError, TypeError):
        return body[:200].decode(errors="replace")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="cronhook health",
        description=__doc__,
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    return check(args.url or default_url(os.environ), args.ready)
