"""`cronhook targets|dead-letters|audit|schedules ...`: the client verbs for everything but
jobs, each one API call or a paged list."""

from __future__ import annotations

import argparse
from typing import Any

from app.client.http import ApiClient, Listing, UsageError
from app.client.jobs import JOB_DETAIL, Shown, completion_text, with_schedule

TARGET_COLUMNS = ("id", "name", "url", "timeout_s", "max_in_flight", "rate_per_s", "completion")
TARGET_DETAIL = (
    *TARGET_COLUMNS, "headers", "retry_on_status", "async_timeout_s", "heartbeat_timeout_s",
    "async_counts_in_flight", "created_at",
)  # fmt: skip
DEAD_LETTER_COLUMNS = ("id", "job_id", "scheduled_for", "attempts", "last_status_code", "created_at", "replay_job_id")
DEAD_LETTER_DETAIL = (
    "id", "job_id", "target_id", "scheduled_for", "attempts", "last_status_code", "last_error", "payload",
    "created_at", "replayed_at", "replay_job_id", "runs",
)  # fmt: skip
AUDIT_COLUMNS = ("id", "created_at", "actor", "api_key_id", "action", "object_id", "request_id")
# The largest page each list asks for (the API's own maximum).
TARGETS_PAGE_MAX = 200
DEAD_LETTERS_PAGE_MAX = 200
AUDIT_PAGE_MAX = 500
TARGET_FIELDS = (
    "name", "url", "timeout_s", "max_in_flight", "rate_per_s",
    "completion", "async_timeout_s", "heartbeat_timeout_s", "async_counts_in_flight",
)  # fmt: skip


def _targets(items: Any, as_json: bool) -> Any:
    """Targets; a table spells out the completion mode with its timeouts."""
    if as_json:
        return items
    if isinstance(items, Listing):
        return Listing(_targets(items.items, as_json), items.next_cursor)
    if isinstance(items, list):
        return [{**target, "completion": completion_text(target)} for target in items]
    return {**items, "completion": completion_text(items)}


def _target_body(args: argparse.Namespace) -> dict[str, Any]:
    body = {field: getattr(args, field) for field in TARGET_FIELDS if getattr(args, field) is not None}
    if args.header:
        body["headers"] = dict(args.header)
    return body


def _deleted(kind: str, ident: str) -> Shown:
    return {"id": ident, "deleted": kind}, ("id", "deleted")


def targets_create(api: ApiClient, args: argparse.Namespace) -> Shown:
    created = api.call("POST", "/v1/targets", json=_target_body(args))
    return _targets(created, args.json), (*TARGET_COLUMNS, "secret")


def targets_get(api: ApiClient, args: argparse.Namespace) -> Shown:
    return _targets(api.call("GET", f"/v1/targets/{args.id}"), args.json), TARGET_DETAIL


def targets_update(api: ApiClient, args: argparse.Namespace) -> Shown:
    body = _target_body(args)
    if not body:
        raise UsageError("nothing to change: give at least one option (see `cronhook targets update --help`)")
    return _targets(api.call("PATCH", f"/v1/targets/{args.id}", json=body), args.json), TARGET_DETAIL


def targets_delete(api: ApiClient, args: argparse.Namespace) -> Shown:
    api.call("DELETE", f"/v1/targets/{args.id}")
    return _deleted("target", args.id)


def targets_list(api: ApiClient, args: argparse.Namespace) -> Shown:
    listing = api.pages("/v1/targets", {}, None if args.all else args.limit, TARGETS_PAGE_MAX, args.cursor)
    return _targets(listing, args.json), TARGET_COLUMNS


def targets_rotate_secret(api: ApiClient, args: argparse.Namespace) -> Shown:
    body = None if args.grace is None else {"grace_s": args.grace}
    return api.call("POST", f"/v1/targets/{args.id}/rotate-secret", json=body), ("id", "secret")


def dead_letters_list(api: ApiClient, args: argparse.Namespace) -> Shown:
    params = {"job_id": args.job, "target_id": args.target}
    limit = None if args.all else args.limit
    return api.pages("/v1/dead-letters", params, limit, DEAD_LETTERS_PAGE_MAX, args.cursor), DEAD_LETTER_COLUMNS


def dead_letters_get(api: ApiClient, args: argparse.Namespace) -> Shown:
    return api.call("GET", f"/v1/dead-letters/{args.id}"), DEAD_LETTER_DETAIL


def dead_letters_delete(api: ApiClient, args: argparse.Namespace) -> Shown:
    api.call("DELETE", f"/v1/dead-letters/{args.id}")
    return _deleted("dead letter", args.id)


def dead_letters_replay(api: ApiClient, args: argparse.Namespace) -> Shown:
    if args.id:
        return with_schedule(api.call("POST", f"/v1/dead-letters/{args.id}/replay")), JOB_DETAIL
    if not args.all:
        raise UsageError("name a dead letter, or pass --all to replay every one not yet replayed")
    body: dict[str, Any] = {"limit": args.limit, "rate_per_s": args.rate, "include_replayed": args.include_replayed}
    for field in ("job_id", "target_id"):
        if getattr(args, field) is not None:
            body[field] = getattr(args, field)
    result = api.call("POST", "/v1/dead-letters/replay", json=body)
    return (result if args.json else result["replayed"]), ("dead_letter_id", "job_id", "next_run_at")


def audit_list(api: ApiClient, args: argparse.Namespace) -> Shown:
    limit = None if args.all else args.limit
    return api.pages("/v1/audit", {}, limit, AUDIT_PAGE_MAX, args.cursor), AUDIT_COLUMNS


def schedules_preview(api: ApiClient, args: argparse.Namespace) -> Shown:
    params = {"cron": args.cron, "timezone": args.timezone, "count": args.count}
    result = api.call("GET", "/v1/schedules/preview", params=params)
    return (result if args.json else result["fire_times"]), ("at", "utc", "utc_offset")
