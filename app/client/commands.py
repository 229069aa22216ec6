"""Client verbs of `cronhook`: jobs, targets, dead-letters, audit, schedules, and schedules as
code (apply, diff, export: app/client/schedules_as_code.py).

Each verb is one API call (or a paged list) to the server named by `--server` or
CRONHOOK_URL; `--json` prints the API's own JSON (a list: the page object, with its
`next_cursor`). Key management (`cronhook api-key create|list|revoke`, app/cli_security.py)
goes through the admin API when a server is named, or to the database otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from app.client import jobs as job_verbs
from app.client import resources
from app.client import schedules_as_code as as_code
from app.client.http import ApiClient, ApiError
from app.client.output import render, stdout_closed

# A verb's exit status, in every `--help` and in the README.
EXIT_STATUS = """exit status:
  0  done
  1  the server refused (it answered 4xx or 5xx; the line names the server)
  2  usage: a command line no request can carry
  3  the server did not answer (nothing listens at --server / CRONHOOK_URL)
  130  interrupted (Ctrl-C)"""
# Ctrl-C, as a shell reports it (128 + SIGINT).
INTERRUPTED = 130
COMPLETION_MODES = ("sync", "async")
# Re-exported: the tests abbreviate results the way tables do.
RESULT_CHARS = job_verbs.RESULT_CHARS


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def payload_arg(text: str) -> dict[str, Any]:
    """A JSON object given inline, as `@FILE`, or as `-` (read from stdin)."""
    if text == "-":
        return _json_object(sys.stdin.read())
    if text.startswith("@"):
        path = Path(text[1:])
        try:
            return _json_object(path.read_text())
        except OSError as exc:
            raise argparse.ArgumentTypeError(f"cannot read {path}: {exc.strerror}") from None
    return _json_object(text)


def _header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError("use NAME=VALUE")
    return name, value


def _verb(group: Any, name: str, handler: job_verbs.Handler, help_text: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = group.add_parser(
        name, help=help_text, description=help_text, epilog=EXIT_STATUS, formatter_class=_Formatter
    )
    parser.add_argument("--server", help="server URL (CRONHOOK_URL, default http://127.0.0.1:8080)")
    parser.add_argument("--api-key", help="API key (CRONHOOK_API_KEY); prefer the variable: arguments show in ps")
    parser.add_argument("--json", action="store_true", help="print the API's JSON")
    parser.set_defaults(client=True, handler=handler)
    return parser


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the exit status table as written."""


def _group(sub: Any, name: str, help_text: str) -> Any:
    parser = sub.add_parser(name, help=help_text, epilog=EXIT_STATUS, formatter_class=_Formatter)
    return parser.add_subparsers(dest="verb", required=True)


def _list_arguments(parser: argparse.ArgumentParser, default_limit: int) -> None:
    parser.add_argument(
        "--limit", type=_positive, default=default_limit, help=f"at most this many (default {default_limit})"
    )
    parser.add_argument("--all", action="store_true", help="every page")
    parser.add_argument("--cursor", help="go on where a list that was cut stopped (its next_cursor)")


def _positive(text: str) -> int:
    number = int(text)
    if number < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return number


def _completion_arguments(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument(
        "--completion",
        choices=COMPLETION_MODES,
        help=f"async: a 202 answer leaves the attempt open until the receiver reports (default: {default})",
    )
    parser.add_argument(
        "--async-timeout", type=int, dest="async_timeout_s", metavar="SECONDS", help="async: longest attempt"
    )
    parser.add_argument(
        "--heartbeat-timeout",
        type=int,
        dest="heartbeat_timeout_s",
        metavar="SECONDS",
        help="async: fail an attempt whose receiver has not reported for this long",
    )


def _job_arguments(parser: argparse.ArgumentParser, completion_default: str) -> None:
    """The options of `jobs create` and `jobs update`: each sets the API field it names."""
    parser.add_argument(
        "--payload", type=payload_arg, metavar="JSON|@FILE|-", help="JSON object sent as the body (@FILE, - for stdin)"
    )
    parser.add_argument("--name")
    parser.add_argument("--delay", type=float, metavar="SECONDS", help="run once, this long from now")
    parser.add_argument("--at", metavar="RFC3339", help="run once at, e.g. 2026-01-01T09:00:00+01:00")
    parser.add_argument("--cron", help="cron expression")
    parser.add_argument("--timezone", help="IANA zone for --cron (default UTC)")
    parser.add_argument("--every", type=int, metavar="SECONDS", help="run every this many seconds")
    parser.add_argument("--start-at", dest="start_at", metavar="RFC3339", help="recurring: no fire time before this")
    parser.add_argument("--end-at", dest="end_at", metavar="RFC3339", help="recurring: no fire time after this")
    parser.add_argument("--max-runs", dest="max_runs", type=int, help="recurring: end after this many occurrences")
    parser.add_argument(
        "--overlap", dest="overlap_policy", choices=("forbid", "allow"), help="recurring: fire times due while one runs"
    )
    parser.add_argument(
        "--misfire", dest="misfire_policy", choices=("skip", "fire_once", "catch_up"), help="recurring: when late"
    )
    parser.add_argument("--misfire-grace", dest="misfire_grace_s", type=float, metavar="SECONDS")
    parser.add_argument("--catch-up-limit", dest="catch_up_limit", type=int)
    parser.add_argument("--interval-mode", dest="interval_mode", choices=("fixed_rate", "fixed_delay"))
    parser.add_argument(
        "--jitter", dest="jitter_s", type=int, metavar="SECONDS", help="recurring: fire each occurrence up to this late"
    )
    parser.add_argument(
        "--after", metavar="JOB_ID", help="instead of a schedule: run after each occurrence of this job"
    )
    parser.add_argument(
        "--on", choices=("success", "failure", "any"), help="with --after: which outcome (default success)"
    )
    parser.add_argument(
        "--payload-from", dest="payload_from", choices=("parent_result",), help="with --after: the parent's result"
    )
    parser.add_argument("--priority", type=int)
    parser.add_argument("--max-attempts", type=int, dest="max_attempts")
    _completion_arguments(parser, completion_default)


def _add_job_commands(sub: Any) -> None:
    jobs = _group(sub, "jobs", "jobs on a running server")
    create = _verb(jobs, "create", job_verbs.jobs_create, "schedule a job (now, unless --delay/--at/--cron/--every)")
    create.add_argument("--target", required=True, help="target id")
    create.add_argument("--dedup-key", dest="dedup_key")
    _job_arguments(create, "the target's")
    update = _verb(jobs, "update", job_verbs.jobs_update, "change a waiting job: only the options given")
    update.add_argument("id")
    update.add_argument("--target", help="target id")
    _job_arguments(update, "unchanged")
    listing = _verb(jobs, "list", job_verbs.jobs_list, "list jobs, newest first")
    listing.add_argument("--state")
    listing.add_argument("--target")
    listing.add_argument("--health", help="only jobs showing this health: healthy, late, failing, paused, unknown")
    _list_arguments(listing, 50)
    for action, help_text in (
        ("get", "show a job"),
        ("cancel", "cancel a job"),
        ("pause", "pause a job"),
        ("resume", "resume a paused job"),
        ("trigger", "one extra occurrence now"),
    ):
        verb = _verb(jobs, action, job_verbs.job_action(action), help_text)
        verb.add_argument("id")
        if action == "cancel":
            verb.add_argument("--cascade", action="store_true", help="also cancel the jobs chained after it")
    runs = _verb(jobs, "runs", job_verbs.jobs_runs, "a job's attempts, newest first (an open async attempt first)")
    runs.add_argument("id")
    runs.add_argument("--order", choices=("desc", "asc"), default="desc", help="desc: newest first (default)")
    _list_arguments(runs, 100)
    watch = _verb(jobs, "watch", job_verbs.jobs_watch, "print a job's changes until it finishes (or Ctrl-C)")
    watch.add_argument("id")
    watch.add_argument("--interval", type=float, default=2.0, metavar="SECONDS", help="poll interval (default 2)")


def _target_arguments(parser: argparse.ArgumentParser, required: bool) -> None:
    parser.add_argument("--name", required=required)
    parser.add_argument("--url", required=required, help="the webhook URL")
    parser.add_argument("--header", type=_header, action="append", metavar="NAME=VALUE")
    parser.add_argument("--timeout", type=float, dest="timeout_s")
    parser.add_argument("--max-in-flight", type=int, dest="max_in_flight")
    parser.add_argument("--rate", type=float, dest="rate_per_s", metavar="PER_S")
    _completion_arguments(parser, "sync" if required else "unchanged")
    parser.add_argument(
        "--async-outside-in-flight",
        action="store_const",
        const=False,
        dest="async_counts_in_flight",
        help="open async attempts do not count against --max-in-flight",
    )
    if not required:
        parser.add_argument(
            "--async-in-flight",
            action="store_const",
            const=True,
            dest="async_counts_in_flight",
            help="open async attempts count against --max-in-flight again",
        )


def _add_target_commands(sub: Any) -> None:
    targets = _group(sub, "targets", "webhook targets")
    create = _verb(targets, "create", resources.targets_create, "create a target; prints its signing secret once")
    _target_arguments(create, required=True)
    _list_arguments(_verb(targets, "list", resources.targets_list, "list targets"), 200)
    _verb(targets, "get", resources.targets_get, "show a target").add_argument("id")
    update = _verb(targets, "update", resources.targets_update, "change a target: only the options given")
    update.add_argument("id")
    _target_arguments(update, required=False)
    _verb(targets, "delete", resources.targets_delete, "delete a target").add_argument("id")
    rotate = _verb(targets, "rotate-secret", resources.targets_rotate_secret, "new signing secret")
    rotate.add_argument("id")
    rotate.add_argument(
        "--grace", type=float, metavar="SECONDS", help="the old secret signs alongside for this long (default 1 day)"
    )


def _add_dead_letter_commands(sub: Any) -> None:
    dead = _group(sub, "dead-letters", "dead letters")
    dlist = _verb(dead, "list", resources.dead_letters_list, "list dead letters")
    dlist.add_argument("--job")
    dlist.add_argument("--target")
    _list_arguments(dlist, 50)
    _verb(dead, "get", resources.dead_letters_get, "show a dead letter and its attempts").add_argument("id")
    _verb(dead, "delete", resources.dead_letters_delete, "delete a dead letter").add_argument("id")
    replay = _verb(dead, "replay", resources.dead_letters_replay, "replay one dead letter, or --all")
    replay.add_argument("id", nargs="?")
    replay.add_argument("--all", action="store_true", help="every dead letter not replayed yet (up to --limit)")
    replay.add_argument("--job", dest="job_id")
    replay.add_argument("--target", dest="target_id")
    replay.add_argument("--include-replayed", action="store_true", help="also those replayed before")
    replay.add_argument("--limit", type=int, default=100)
    replay.add_argument("--rate", type=float, default=10.0, metavar="PER_S")


APPLY_DESCRIPTION = """Make the server's targets and set of schedules match FILE (YAML or JSON):
each target of the file is put by name, then the whole set at once (all or nothing).
What already matches is not written: those schedules keep their next fire times.
A target created prints its signing secret once, on stderr. Mistakes are named
FILE:LINE: FIELD (found here: exit 2, nothing written; by the server: exit 1).

--dry-run writes nothing: targets are only read (header values, never shown, and
a timeout_s left to the server's default are not compared), and the server plans
the set. A schedule whose target does not exist yet cannot be sent without its
target's id: it is shown as `? KEY` (would be created with that target), and the
server checks it only when the file is applied.

file format:
  set: payments-nightly      # optional: the file's name without its extension
  targets:                   # by name: POST /v1/targets's fields but name (no secrets)
    billing: {url: https://billing.example.com/hooks/cron, timeout_s: 10}
  schedules:                 # by key: POST /v1/jobs's fields, `target` a target's name
    nightly-report: {target: billing, cron: "H 3 * * *", payload: {report: daily}}

output: `+`, `~ (fields)`, `=` per target and schedule (created, changed,
unchanged), `- KEY` pruned, `? KEY` not checked; --json prints the answers."""

DIFF_EXIT_STATUS = """exit status (as diff's):
  0  nothing would change
  1  something would change (the plan says what)
  2  trouble: a mistake in FILE, or the server refused it
  3  the server did not answer (nothing listens at --server / CRONHOOK_URL)
  130  interrupted (Ctrl-C)"""

EXPORT_DESCRIPTION = """Print the file that, applied to this server, changes nothing: the named
schedules (of --set, else all) and the targets they use, by name. Never a
secret: a target with headers (whose values the server never shows) is left
out of `targets:` (its schedules still name it, and apply leaves it as it is).
Exit 1 also when two targets the schedules use share a name."""


def _add_schedules_as_code(sub: Any) -> None:
    apply = _verb(sub, "apply", as_code.apply_verb, "make the server match a schedules file")
    apply.description = APPLY_DESCRIPTION
    diff = _verb(sub, "diff", as_code.diff_verb, "what `apply -f FILE` would change (exit 1 if anything)")
    diff.description = "`apply --dry-run`, shown as a plan (see `cronhook apply --help`)."
    diff.epilog = DIFF_EXIT_STATUS
    for verb in (apply, diff):
        verb.add_argument("-f", "--file", required=True, metavar="FILE", help="the schedules file (YAML or JSON)")
        verb.add_argument("--prune", action="store_true", help="also cancel the set's schedules not in the file")
    apply.add_argument("--dry-run", action="store_true", help="write nothing: show what would change")
    export = _verb(sub, "export", as_code.export_verb, "print a schedules file of the server's named schedules")
    export.description = EXPORT_DESCRIPTION
    export.add_argument("--set", help="only this set's schedules (and `set:` in the file)")
    export.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")


def add_client_commands(sub: Any) -> None:
    _add_job_commands(sub)
    _add_target_commands(sub)
    _add_dead_letter_commands(sub)
    _add_schedules_as_code(sub)

    audit = _group(sub, "audit", "the tenant's audit log")
    _list_arguments(_verb(audit, "list", resources.audit_list, "every change made in this tenant, newest first"), 50)

    schedules = _group(sub, "schedules", "cron previews")
    preview = _verb(schedules, "preview", resources.schedules_preview, "the next fire times of a cron expression")
    preview.add_argument("cron")
    preview.add_argument("--timezone", default="UTC")
    preview.add_argument("--count", type=int, default=10)


def run_client_command(args: argparse.Namespace) -> int:
    """Runs the verb and prints what it shows; the exit status of EXIT_STATUS."""
    try:
        with ApiClient(args.server, args.api_key) as api:
            shown = args.handler(api, args)
            if shown is not None:
                data, columns = shown
                render(data, columns, sys.stdout, args.json)
            sys.stdout.flush()
    except ApiError as exc:
        print(f"cronhook: {exc}", file=sys.stderr)  # noqa: T201
        return exc.exit_code
    except BrokenPipeError:
        # The reader (`| head`) has what it wanted.
        stdout_closed()
        return 0
    except KeyboardInterrupt:
        return INTERRUPTED
    return 0


def client_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="cronhook", description="cronhook client verbs", epilog=EXIT_STATUS, formatter_class=_Formatter
    )
    add_client_commands(parser.add_subparsers(dest="command", required=True))
    return run_client_command(parser.parse_args(argv))
