"""`cronhook jobs ...`: create, update, list, show, control and watch jobs, and read their runs
(newest first), as tables for people or the API's JSON for scripts."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from app.client.http import ApiClient, Listing, UsageError
from app.domain.job import AWAITING_COMPLETION
from app.domain.states import TERMINAL_STATES

Shown = tuple[Any, tuple[str, ...]]
Handler = Callable[[ApiClient, argparse.Namespace], Shown | None]

JOB_COLUMNS = ("id", "name", "state", "health", "schedule", "next_run_at", "attempt", "last_status_code")
JOB_DETAIL = (
    "id", "key", "name", "labels", "state", "health", "target_id", "schedule", "completion", "priority",
    "next_run_at", "attempt", "max_attempts", "runs", "last_status_code", "last_error", "last_success_at",
    "last_failure_at", "consecutive_failures", "expect", "payload", "created_at",
)  # fmt: skip
RUN_COLUMNS = ("scheduled_for", "attempt", "outcome", "status_code", "duration_ms", "finished_at", "error")
# Async runs (open, or finished with a receiver's report) add a column after the outcome.
ASYNC_RUN_COLUMNS = (*RUN_COLUMNS[:3], "report", *RUN_COLUMNS[3:])
# A finished async run's result, in a table, is cut to this many characters (--json has it whole).
RESULT_CHARS = 60
# The largest page each list asks for (the API's own maximum).
JOBS_PAGE_MAX = 200
RUNS_PAGE_MAX = 500
# What `jobs watch` reports a change of.
WATCHED = ("state", "attempt", "runs", "last_status_code", "awaiting_completion", "progress", "next_run_at")

# The fields of a job's body each option sets, as the API names them (create and update alike).
JOB_FIELDS = (
    "payload", "name", "cron", "timezone", "priority", "max_attempts", "completion", "async_timeout_s",
    "heartbeat_timeout_s", "start_at", "end_at", "max_runs", "overlap_policy", "misfire_policy",
    "misfire_grace_s", "catch_up_limit", "interval_mode", "jitter_s", "payload_from",
)  # fmt: skip


def _schedule(job: dict[str, Any]) -> str:
    jitter = f" jitter {job['jitter_s']}s" if job.get("jitter_s") else ""
    if job.get("cron"):
        resolved = job.get("resolved_cron")
        shown = job["cron"] if resolved in (None, job["cron"]) else f"{job['cron']} ({resolved})"
        return f"cron {shown} {job.get('timezone') or 'UTC'}{jitter}"
    if job.get("every_s"):
        return f"every {job['every_s']}s{jitter}"
    if job.get("after"):
        return f"after {job['after']['job_id']} on {job['after']['on']}"
    if job.get("cause_id"):
        return f"once, caused by {job['cause_id']}"
    return "once"


def with_schedule(items: Any) -> Any:
    if isinstance(items, Listing):
        return Listing(with_schedule(items.items), items.next_cursor)
    if isinstance(items, list):
        return [{**job, "schedule": _schedule(job)} for job in items]
    return {**items, "schedule": _schedule(items)}


def completion_text(item: dict[str, Any], inherited: str = "sync") -> str:
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


def _job_detail(job: dict[str, Any], as_json: bool) -> Shown:
    """One job; a table names its completion mode and shows an open async attempt under its state."""
    shown = with_schedule(job)
    if as_json:
        return shown, JOB_DETAIL
    shown["completion"] = completion_text(job, inherited="the target's")
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


def _job_body(args: argparse.Namespace) -> dict[str, Any]:
    """The fields this command line sets, as the API names them."""
    body = {field: getattr(args, field) for field in JOB_FIELDS if getattr(args, field) is not None}
    for option, field in (("delay", "delay_s"), ("at", "run_at"), ("every", "every_s")):
        if getattr(args, option) is not None:
            body[field] = getattr(args, option)
    if args.after is not None:
        body["after"] = {"job_id": args.after, **({"on": args.on} if args.on else {})}
    elif args.on is not None:
        raise UsageError("--on goes with --after (the job this one runs after)")
    return body


def jobs_create(api: ApiClient, args: argparse.Namespace) -> Shown:
    body: dict[str, Any] = {"target_id": args.target, **_job_body(args)}
    if args.dedup_key is not None:
        body["dedup_key"] = args.dedup_key
    if not any(k in body for k in ("delay_s", "run_at", "cron", "every_s", "after")):
        body["delay_s"] = 0.001  # now
    return _job_detail(api.call("POST", "/v1/jobs", json=body), args.json)


def jobs_update(api: ApiClient, args: argparse.Namespace) -> Shown:
    """PATCH: only the fields given change; a new schedule replaces the old one."""
    body = _job_body(args)
    if args.target is not None:
        body["target_id"] = args.target
    if not body:
        raise UsageError("nothing to change: give at least one option (see `cronhook jobs update --help`)")
    return _job_detail(api.call("PATCH", f"/v1/jobs/{args.id}", json=body), args.json)


def jobs_list(api: ApiClient, args: argparse.Namespace) -> Shown:
    params = {"state": args.state, "target_id": args.target, "health": args.health}
    limit = None if args.all else args.limit
    return with_schedule(api.pages("/v1/jobs", params, limit, JOBS_PAGE_MAX, args.cursor)), JOB_COLUMNS


def job_action(action: str) -> Handler:
    def handler(api: ApiClient, args: argparse.Namespace) -> Shown:
        if action == "get":
            return _job_detail(api.call("GET", f"/v1/jobs/{args.id}"), args.json)
        if action == "cancel" and args.cascade:
            return _job_detail(api.call("POST", f"/v1/jobs/{args.id}/cancel", params={"cascade": "true"}), args.json)
        return _job_detail(api.call("POST", f"/v1/jobs/{args.id}/{action}"), args.json)

    return handler


def jobs_runs(api: ApiClient, args: argparse.Namespace) -> Shown:
    """A job's runs, newest first (an open async attempt first of all) or with `--order asc`
    oldest first. A table gains a `report` column when a receiver reported on any of them."""
    limit = None if args.all else args.limit
    listing = api.pages(f"/v1/jobs/{args.id}/runs", {"order": args.order}, limit, RUNS_PAGE_MAX, args.cursor)
    reports = [_run_report(run) for run in listing.items]
    if args.json or not any(reports):
        return listing, RUN_COLUMNS
    shown = [{**run, "report": report} for run, report in zip(listing.items, reports, strict=True)]
    return Listing(shown, listing.next_cursor), ASYNC_RUN_COLUMNS


def _change_line(job: dict[str, Any]) -> str:
    """`12:00:03  running  attempt 1  runs 0  awaiting_completion 40% ...`: one state of a job."""
    parts = [dt.datetime.now().astimezone().strftime("%H:%M:%S"), str(job["state"]), f"attempt {job.get('attempt')}"]
    parts.append(f"runs {job.get('runs')}")
    if job.get("last_status_code") is not None:
        parts.append(f"last_status_code {job['last_status_code']}")
    if job.get("awaiting_completion"):
        parts.append(f"{AWAITING_COMPLETION} {_progress(job)}")
    elif job["state"] not in TERMINAL_STATES and job.get("next_run_at"):
        parts.append(f"next_run_at {job['next_run_at']}")
    if job["state"] in TERMINAL_STATES and job.get("last_error"):
        parts.append(f"last_error {json.dumps(job['last_error'], ensure_ascii=False)}")
    return "  ".join(parts)


def jobs_watch(api: ApiClient, args: argparse.Namespace) -> None:
    """Polls the job and prints a line (with --json, the job) each time it changes, until it
    finishes (succeeded, dead or cancelled). Ctrl-C stops watching; the job is untouched."""
    seen: tuple[Any, ...] | None = None
    while True:
        job = api.call("GET", f"/v1/jobs/{args.id}")
        state = tuple(job.get(field) for field in WATCHED)
        if state != seen:
            seen = state
            line = json.dumps(job, sort_keys=True) if args.json else _change_line(job)
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
        if job["state"] in TERMINAL_STATES:
            return
        time.sleep(args.interval)
