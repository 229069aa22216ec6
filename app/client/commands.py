"""Client verbs of `cronhook`: jobs, targets, dead-letters, schedules.

Each verb is one API call (or a paged list); `--json` prints the API's own JSON. Key
management (`cronhook api-key create|list|revoke`, app/cli_security.py) lives with the keys,
which act on the database, not through the API.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from app.client.http import ApiClient, ApiError
from app.client.output import render
from app.domain.job import AWAITING_COMPLETION

JOB_COLUMNS = ("id", "name", "state", "schedule", "next_run_at", "attempt", "last_status_code")
JOB_DETAIL = (
    "id", "name", "state", "target_id", "schedule", "completion", "priority", "next_run_at", "attempt",
    "max_attempts", "runs", "last_status_code", "last_error", "payload", "created_at",
)  # fmt: skip
RUN_COLUMNS = ("scheduled_for", "attempt", "outcome", "status_code", "duration_ms", "finished_at", "error")
# Async runs (open, or finished with a receiver's report) add a column after the outcome.
ASYNC_RUN_COLUMNS = (*RUN_COLUMNS[:3], "report", *RUN_COLUMNS[3:])
TARGET_COLUMNS = ("id", "name", "url", "timeout_s", "max_in_flight", "rate_per_s", "completion")
# A finished async run's result, in a table, is cut to this many characters (--json has it whole).
RESULT_CHARS = 60
COMPLETION_MODES = ("sync", "async")
DEAD_LETTER_COLUMNS = ("id", "job_id", "scheduled_for", "attempts", "last_status_code", "created_at", "replay_job_id")

Handler = Callable[[ApiClient, argparse.Namespace], tuple[Any, tuple[str, ...]]]


def _schedule(job: dict[str, Any]) -> str:
    if job.get("cron"):
        return f"cron {job['cron']} {job.get('timezone') or 'UTC'}"
    if job.get("every_s"):
        return f"every {job['every_s']}s"
    return "once"


def _jobs(items: Any) -> Any:
    if isinstance(items, list):
        return [{**job, "schedule": _schedule(job)} for job in items]
    return {**items, "schedule": _schedule(items)}


def _completion(item: dict[str, Any], inherited: str = "sync") -> str:
    """A target's or job's completion mode with the timeouts it sets: `async (timeout 600s, heartbeat 60s)`."""
    mode = str(item.get("completion") or inherited)
    if mode == "sync":
        return mode
    details = [
        f"{label} {item[field]}s"
        for label, field in (("timeout", "async_timeout_s"), ("heartbeat", "heartbeat_timeout_s"))
        if item.get(field)
    ]
    if item.get("async_counts_in_flight") is False:
        details.append("not counted in max_in_flight")
    return f"{mode} ({', '.join(details)})" if details else mode


def _progress(item: dict[str, Any]) -> str:
    """An open attempt as its receiver last reported it: `40% "halfway" deadline ...`."""
    parts = [] if item.get("progress") is None else [f"{item['progress']}%"]
    if item.get("progress_message"):
        parts.append(json.dumps(item["progress_message"], ensure_ascii=False))
    parts.append(f"deadline {item.get('deadline_at') or '-'}")
    return " ".join(parts)


def _abbreviated(value: Any) -> str:
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return text if len(text) <= RESULT_CHARS else text[: RESULT_CHARS - 3] + "..."


def _run_report(run: dict[str, Any]) -> str | None:
    """What a receiver reported on an async run: an open one's progress, a finished one's result."""
    if run.get("outcome") == AWAITING_COMPLETION:
        return _progress(run)
    parts = [] if run.get("result") is None else [f"result {_abbreviated(run['result'])}"]
    if run.get("fenced_at"):
        parts.append(f"late report refused at {run['fenced_at']}")
    return " ".join(parts) or None


def _job_detail(job: dict[str, Any], as_json: bool) -> tuple[Any, tuple[str, ...]]:
    """One job; a table names its completion mode and shows an open async attempt under its state."""
    shown = _jobs(job)
    if as_json:
        return shown, JOB_DETAIL
    shown["completion"] = _completion(job, inherited="the target's")
    if not job.get("awaiting_completion"):
        return shown, JOB_DETAIL
    attempt = f"{AWAITING_COMPLETION} {_progress(job)}"
    if job.get("heartbeat_deadline_at") not in (None, job.get("deadline_at")):
        attempt += f" heartbeat deadline {job['heartbeat_deadline_at']}"
    if job.get("last_heartbeat_at"):
        attempt += f" last heartbeat {job['last_heartbeat_at']}"
    shown["open_attempt"] = attempt
    at = JOB_DETAIL.index("state") + 1
    return shown, (*JOB_DETAIL[:at], "open_attempt", *JOB_DETAIL[at:])


def _targets(items: Any, as_json: bool) -> Any:
    """Targets; a table spells out the completion mode with its timeouts."""
    if as_json:
        return items
    if isinstance(items, list):
        return [{**target, "completion": _completion(target)} for target in items]
    return {**items, "completion": _completion(items)}


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def _header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError("use NAME=VALUE")
    return name, value


def jobs_create(api: ApiClient, args: argparse.Namespace) -> tuple[Any, tuple[str, ...]]:
    body: dict[str, Any] = {"target_id": args.target}
    for field in (
        "payload", "name", "cron", "timezone", "priority", "dedup_key", "max_attempts",
        "completion", "async_timeout_s", "heartbeat_timeout_s",
    ):  # fmt: skip
        if getattr(args, field) is not None:
            body[field] = getattr(args, field)
    if args.delay is not None:
        body["delay_s"] = args.delay
    if args.at is not None:
        body["run_at"] = args.at
    if args.every is not None:
        body["every_s"] = args.every
    if not any(k in body for k in ("delay_s", "run_at", "cron", "every_s")):
        body["delay_s"] = 0.001  # now
    return _job_detail(api.call("POST", "/v1/jobs", json=body), args.json)


def jobs_list(api: ApiClient, args: argparse.Namespace) -> tuple[Any, tuple[str, ...]]:
    params = {"state": args.state, "target_id": args.target, "limit": min(args.limit or 200, 200)}
    return _jobs(api.pages("/v1/jobs", params, None if args.all else args.limit)), JOB_COLUMNS


def _job_action(action: str) -> Handler:
    def handler(api: ApiClient, args: argparse.Namespace) -> tuple[Any, tuple[str, ...]]:
        if action == "get":
            return _job_detail(api.call("GET", f"/v1/jobs/{args.id}"), args.json)
        return _job_detail(api.call("POST", f"/v1/jobs/{args.id}/{action}"), args.json)

    return handler


def jobs_runs(api: ApiClient, args: argparse.Namespace) -> tuple[Any, tuple[str, ...]]:
    """A job's runs, oldest first; an open async attempt is the last. A table gains a `report`
    column when a receiver reported on any of them."""
    runs = api.pages(f"/v1/jobs/{args.id}/runs", {"limit": min(args.limit, 500)}, args.limit)
    reports = [_run_report(run) for run in runs]
    if args.json or not any(reports):
        return runs, RUN_COLUMNS
    return [{**run, "report": report} for run, report in zip(runs, reports, strict=True)], ASYNC_RUN_COLUMNS


def targets_create(api: ApiClient, args: argparse.Namespace) -> tuple[Any, tuple[str, ...]]:
    body: dict[str, Any] = {"name": args.name, "url": args.url}
    if args.header:
        body["headers"] = dict(args.header)
    for field in (
        "timeout_s", "max_in_flight", "rate_per_s",
        "completion", "async_timeout_s", "heartbeat_timeout_s", "async_counts_in_flight",
    ):  # fmt: skip
        if getattr(args, field) is not None:
            body[field] = getattr(args, field)
    return _targets(api.call("POST", "/v1/targets", json=body), args.json), (*TARGET_COLUMNS, "secret")


def targets_list(api: ApiClient, args: argparse.Namespace) -> tuple[Any, tuple[str, ...]]:
    return _targets(api.pages("/v1/targets", {"limit": 200}, None), args.json), TARGET_COLUMNS


def targets_rotate_secret(api: ApiClient, args: argparse.Namespace) -> tuple[Any, tuple[str, ...]]:
    return api.call("POST", f"/v1/targets/{args.id}/rotate-secret"), ("id", "secret")


def dead_letters_list(api: ApiClient, args: argparse.Namespace) -> tuple[Any, tuple[str, ...]]:
    params = {"job_id": args.job, "target_id": args.target, "limit": min(args.limit, 200)}
    return api.pages("/v1/dead-letters", params, args.limit), DEAD_LETTER_COLUMNS


def dead_letters_replay(api: ApiClient, args: argparse.Namespace) -> tuple[Any, tuple[str, ...]]:
    if args.id:
        return _jobs(api.call("POST", f"/v1/dead-letters/{args.id}/replay")), JOB_DETAIL
    if not args.all:
        raise ApiError("name a dead letter, or pass --all to replay every one not yet replayed")
    body: dict[str, Any] = {"limit": args.limit, "rate_per_s": args.rate, "include_replayed": args.include_replayed}
    for field in ("job_id", "target_id"):
        if getattr(args, field) is not None:
            body[field] = getattr(args, field)
    result = api.call("POST", "/v1/dead-letters/replay", json=body)
    return (result if args.json else result["replayed"]), ("dead_letter_id", "job_id", "next_run_at")


def schedules_preview(api: ApiClient, args: argparse.Namespace) -> tuple[Any, tuple[str, ...]]:
    params = {"cron": args.cron, "timezone": args.timezone, "count": args.count}
    result = api.call("GET", "/v1/schedules/preview", params=params)
    return (result if args.json else result["fire_times"]), ("at", "utc", "utc_offset")


def _verb(group: Any, name: str, handler: Handler, help_text: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = group.add_parser(name, help=help_text)
    parser.add_argument("--server", help="server URL (CRONHOOK_URL, default http://127.0.0.1:8080)")
    parser.add_argument("--api-key", help="API key (CRONHOOK_API_KEY); prefer the variable: arguments show in ps")
    parser.add_argument("--json", action="store_true", help="print the API's JSON")
    parser.set_defaults(client=True, handler=handler)
    return parser


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


def add_client_commands(sub: Any) -> None:
    jobs = sub.add_parser("jobs", help="jobs on a running server").add_subparsers(dest="verb", required=True)
    create = _verb(jobs, "create", jobs_create, "schedule a job (now, unless --delay/--at/--cron/--every)")
    create.add_argument("--target", required=True, help="target id")
    create.add_argument("--payload", type=_json_object, help="JSON object sent as the body")
    create.add_argument("--name")
    create.add_argument("--delay", type=float, metavar="SECONDS")
    create.add_argument("--at", metavar="RFC3339", help="run at, e.g. 2026-01-01T09:00:00+01:00")
    create.add_argument("--cron", help="cron expression")
    create.add_argument("--timezone", help="IANA zone for --cron")
    create.add_argument("--every", type=int, metavar="SECONDS")
    create.add_argument("--priority", type=int)
    create.add_argument("--max-attempts", type=int, dest="max_attempts")
    create.add_argument("--dedup-key", dest="dedup_key")
    _completion_arguments(create, "the target's")
    listing = _verb(jobs, "list", jobs_list, "list jobs, newest first")
    listing.add_argument("--state")
    listing.add_argument("--target")
    listing.add_argument("--limit", type=int, default=50)
    listing.add_argument("--all", action="store_true", help="every page")
    for action, help_text in (
        ("get", "show a job"),
        ("cancel", "cancel a job"),
        ("pause", "pause a job"),
        ("resume", "resume a paused job"),
        ("trigger", "one extra occurrence now"),
    ):
        _verb(jobs, action, _job_action(action), help_text).add_argument("id")
    runs = _verb(jobs, "runs", jobs_runs, "a job's attempts")
    runs.add_argument("id")
    runs.add_argument("--limit", type=int, default=100)

    targets = sub.add_parser("targets", help="webhook targets").add_subparsers(dest="verb", required=True)
    tcreate = _verb(targets, "create", targets_create, "create a target; prints its signing secret once")
    tcreate.add_argument("--name", required=True)
    tcreate.add_argument("--url", required=True, help="the webhook URL")
    tcreate.add_argument("--header", type=_header, action="append", metavar="NAME=VALUE")
    tcreate.add_argument("--timeout", type=float, dest="timeout_s")
    tcreate.add_argument("--max-in-flight", type=int, dest="max_in_flight")
    tcreate.add_argument("--rate", type=float, dest="rate_per_s", metavar="PER_S")
    _completion_arguments(tcreate, "sync")
    tcreate.add_argument(
        "--async-outside-in-flight",
        action="store_const",
        const=False,
        dest="async_counts_in_flight",
        help="open async attempts do not count against --max-in-flight",
    )
    _verb(targets, "list", targets_list, "list targets")
    _verb(targets, "rotate-secret", targets_rotate_secret, "new signing secret").add_argument("id")

    dead = sub.add_parser("dead-letters", help="dead letters").add_subparsers(dest="verb", required=True)
    dlist = _verb(dead, "list", dead_letters_list, "list dead letters")
    dlist.add_argument("--job")
    dlist.add_argument("--target")
    dlist.add_argument("--limit", type=int, default=50)
    replay = _verb(dead, "replay", dead_letters_replay, "replay one dead letter, or --all")
    replay.add_argument("id", nargs="?")
    replay.add_argument("--all", action="store_true", help="every dead letter not replayed yet (up to --limit)")
    replay.add_argument("--job", dest="job_id")
    replay.add_argument("--target", dest="target_id")
    replay.add_argument("--include-replayed", action="store_true", help="also those replayed before")
    replay.add_argument("--limit", type=int, default=100)
    replay.add_argument("--rate", type=float, default=10.0, metavar="PER_S")

    schedules = sub.add_parser("schedules", help="cron previews").add_subparsers(dest="verb", required=True)
    preview = _verb(schedules, "preview", schedules_preview, "the next fire times of a cron expression")
    preview.add_argument("cron")
    preview.add_argument("--timezone", default="UTC")
    preview.add_argument("--count", type=int, default=10)


def run_client_command(args: argparse.Namespace) -> int:
    try:
        with ApiClient(args.server, args.api_key) as api:
            data, columns = args.handler(api, args)
    except ApiError as exc:
        print(f"cronhook: {exc}", file=sys.stderr)  # noqa: T201
        return 1
    render(data, columns, sys.stdout, args.json)
    return 0


def client_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="cronhook", description="cronhook client verbs")
    add_client_commands(parser.add_subparsers(dest="command", required=True))
    return run_client_command(parser.parse_args(argv))
