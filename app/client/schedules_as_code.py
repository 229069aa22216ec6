"""Schedules as code: `cronhook apply|diff -f FILE` and `cronhook export`.

A file (YAML or JSON) states a set of named schedules and the targets they use:

    set: payments-nightly          # optional: the file's name without its extension
    targets:                       # by name: a target's fields as POST /v1/targets takes them, but
      billing:                     # its name (and never a secret)
        url: https://billing.example.com/hooks/cron
    schedules:                     # by key: a job's body as POST /v1/jobs takes it, with `target`
      nightly-report:              # (a target's name, of this file or of the server) for target_id
        target: billing
        cron: "H 3 * * *"

`apply` puts each of the file's targets by name (PUT /v1/targets/by-name/{name}), then the
whole set at once (PUT /v1/schedule-sets/{set}, all or nothing): what matches already is not
written, so those schedules keep their next_run_at. `diff` is `apply --dry-run` shown as a
plan, and `export` writes the file that, applied to the same server, changes nothing. Each
mistake, found here or by the server, is one line naming the file, the line and the field.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from app.client.http import ApiClient, ApiError, UsageError
from app.client.yaml_lines import Document, FileError, FileErrors, dump, field_path, load_document
from app.client.yaml_lines import Path as DocPath

TOP_LEVEL = ("set", "targets", "schedules")
# The API's rule for a schedule's key and a set's name (app/api/schedule_upserts.py), checked
# here first: a refusal after the targets were put would leave the apply half done.
KEY_PATTERN = re.compile(r"^[a-z0-9][a-z0-9._-]{0,199}$")
# A schedule's fields that the file's structure states instead.
NOT_IN_A_SCHEDULE = {"key": "the schedule's key", "set": "the file's `set`", "target_id": "`target` (a name)"}
SCHEDULES_PAGE_MAX = 200
# A target's fields in an export (GET /v1/targets/{id}); headers are left to the server.
EXPORTED_TARGET_FIELDS = (
    "url", "timeout_s", "retry_on_status", "max_in_flight", "rate_per_s", "completion", "async_timeout_s",
    "heartbeat_timeout_s", "async_counts_in_flight", "labels", "auto_pause",
)  # fmt: skip
# What PUT /v1/targets/by-name gives a field the file leaves out (app/api/target_upserts.py),
# for a dry run's comparison; timeout_s's default is a server setting, so it is not compared.
TARGET_DEFAULTS: dict[str, Any] = {
    "headers": {}, "retry_on_status": None, "max_in_flight": None, "rate_per_s": None, "completion": "sync",
    "async_timeout_s": None, "heartbeat_timeout_s": None, "async_counts_in_flight": True, "labels": {},
    "auto_pause": None,
}  # fmt: skip
_ITEM_FIELD = re.compile(r"^schedules\[(\d+)\](?:\.(.+))?$")


class Differs(ApiError):
    """`diff`'s "something would change": exit 1, as diff(1) says it. Not an error."""


class Trouble(ApiError):
    """`diff` could not compare (a refusal): exit 2, as diff(1) says trouble."""

    exit_code = 2


class ProblemKeepingClient(ApiClient):
    """An ApiClient that keeps the last refusal's problem document: its errors name fields
    such as `schedules[3].cron`, which only this module maps back to lines of the file
    (call() turns a refusal into one line of text, which the command still ends with)."""

    def __init__(self, url: str | None, api_key: str | None) -> None:
        super().__init__(url, api_key)
        self.problem: dict[str, Any] = {}
        self._http.event_hooks = {"response": [self._keep_problem]}

    def _keep_problem(self, response: httpx.Response) -> None:
        self.problem = {}
        if response.is_error:
            response.read()
            try:
                body = response.json()
            except ValueError:
                return
            self.problem = body if isinstance(body, dict) else {}


@dataclass(frozen=True)
class ScheduleFile:
    name: str  # as the command line gave it, for error lines
    set: str
    targets: dict[str, dict[str, Any]]
    schedules: dict[str, dict[str, Any]]  # each with its `target` (a name)
    document: Document


def parse_schedule_file(name: str, text: str, default_set: str) -> ScheduleFile:
    """The file's set, targets and schedules, checked for shape; FileErrors lists every mistake.
    Their fields are the API's to check (it names them, and so their lines, when it refuses)."""
    errors: list[FileError] = []
    document = load_document(text, errors)
    root = document.value
    if not isinstance(root, dict):
        raise FileErrors([*errors, document.error((), "must be a mapping of set, targets and schedules")])
    unknown = [key for key in root if key not in TOP_LEVEL]
    errors += [document.error((key,), f"unknown key: a file holds {', '.join(TOP_LEVEL)}") for key in unknown]
    set_name = root.get("set", default_set)
    if not isinstance(set_name, str) or not KEY_PATTERN.fullmatch(set_name):
        whose = "" if "set" in root else " (the file's name: give `set:`)"
        errors.append(document.error(("set",), f"{set_name!r}{whose} must match {KEY_PATTERN.pattern}"))
    targets = document.mappings(("targets",), "by name", errors)
    schedules = document.mappings(("schedules",), "by key", errors)
    errors += [document.error(("targets", t), "needs a url") for t, fields in targets.items() if "url" not in fields]
    for key, fields in schedules.items():
        if not KEY_PATTERN.fullmatch(key):  # not .match: `$` matches before a final newline
            errors.append(document.error(("schedules", key), f"the key must match {KEY_PATTERN.pattern}"))
        errors += [
            document.error(("schedules", key, given), f"not in a file: it is {instead}")
            for given, instead in NOT_IN_A_SCHEDULE.items()
            if given in fields
        ]
        if "target" not in fields:
            errors.append(document.error(("schedules", key), "needs a target (a target's name)"))
        elif not isinstance(fields["target"], str) or not fields["target"]:
            errors.append(document.error(("schedules", key, "target"), "must be a target's name"))
    if errors:
        raise FileErrors(errors)
    return ScheduleFile(name, set_name, targets, schedules, document)


def refusal_errors(
    problem: dict[str, Any], document: Document, sent_keys: list[str], where: DocPath
) -> list[FileError]:
    """A refusal's field errors as mistakes of the file: `schedules[i].field` is a field of the
    i-th schedule sent (its key in `sent_keys`; target_id is the file's `target`); `set` and
    `prune` are the file's own; any other field is under `where` (a target's fields)."""

    def path_of(field_name: str) -> DocPath:
        item = _ITEM_FIELD.match(field_name)
        if item and int(item[1]) < len(sent_keys):
            rest = field_path(item[2] or "")
            rest = ("target", *rest[1:]) if rest[:1] == ("target_id",) else () if rest == ("key",) else rest
            return ("schedules", sent_keys[int(item[1])], *rest)
        return field_path(field_name) if field_name in ("set", "prune") else (*where, *field_path(field_name))

    return document.problem_errors(problem, path_of)


@dataclass
class TargetOutcome:
    """What a PUT by name did (or, in a dry run, would do) to one of the file's targets."""

    name: str
    target_id: str | None  # None: a dry run's target that does not exist yet
    mark: str  # + created, ~ changed, = unchanged
    changed: list[str] = field(default_factory=list)
    not_compared: list[str] = field(default_factory=list)
    answer: dict[str, Any] | None = None  # the server's: a PUT's without its secret, or a dry run's GET

    def shown(self) -> dict[str, Any]:
        outcome = {"+": "created", "~": "changed", "=": "unchanged"}[self.mark]
        return {"outcome": outcome, "changed": self.changed, "not_compared": self.not_compared, "target": self.answer}


@dataclass(frozen=True)
class Outcome:
    file: ScheduleFile
    dry_run: bool
    targets: list[TargetOutcome]
    answer: dict[str, Any] | None  # the set PUT's; None when a dry run had nothing to send
    held_back: dict[str, str]  # a dry run's schedules whose target does not exist yet: key -> target

    def changes(self) -> int:
        answer = self.answer or {}
        counted = [answer.get("created"), answer.get("changed"), answer.get("pruned"), self.held_back]
        return sum(t.mark != "=" for t in self.targets) + sum(len(c or ()) for c in counted)


def _by_name(name: str) -> str:
    return f"/v1/targets/by-name/{quote(name, safe='')}"


def _report(api: ProblemKeepingClient, schedule_file: ScheduleFile, sent_keys: list[str], where: DocPath) -> None:
    for error in refusal_errors(api.problem, schedule_file.document, sent_keys, where):
        sys.stderr.write(error.text(schedule_file.name) + "\n")


def _server_targets(api: ProblemKeepingClient, schedule_file: ScheduleFile) -> dict[str, str]:
    """The ids of the targets the schedules name but the file does not define (reads only)."""
    ids: dict[str, str] = {}
    missing = []
    for key, fields in schedule_file.schedules.items():
        name = fields["target"]
        if name in schedule_file.targets or name in ids:
            continue
        try:
            ids[name] = str(api.call("GET", _by_name(name))["id"])
        except ApiError:
            if api.problem.get("status") != 404:
                _report(api, schedule_file, [], ("schedules", key, "target"))
                raise
            missing.append(schedule_file.document.error(("schedules", key, "target"), f"no target is named {name!r}"))
    if missing:
        raise FileErrors(missing)
    return ids


def _dry_run_target(api: ProblemKeepingClient, name: str, fields: dict[str, Any]) -> TargetOutcome:
    """What a PUT of `fields` would do to the target `name`, from a GET. Header values are never
    shown, and timeout_s's default is the server's: those are not compared."""
    try:
        current = api.call("GET", _by_name(name))
    except ApiError:
        if api.problem.get("status") != 404:
            raise
        return TargetOutcome(name, None, "+")
    changed = []
    for field_name, wanted in sorted((TARGET_DEFAULTS | fields).items()):
        held = current.get(field_name)
        if field_name == "headers" and isinstance(wanted, dict):
            wanted, held = sorted(str(h).lower() for h in wanted), sorted(h.lower() for h in held or {})
        elif field_name == "retry_on_status" and isinstance(wanted, list) and all(type(s) is int for s in wanted):
            wanted = sorted(set(wanted))
        changed += [field_name] if wanted != held else []
    not_compared = ["header values"] if fields.get("headers") and "headers" not in changed else []
    not_compared += [] if "timeout_s" in fields else ["timeout_s (the server's default)"]
    return TargetOutcome(name, str(current["id"]), "~" if changed else "=", changed, not_compared, current)


def _put_target(api: ProblemKeepingClient, name: str, fields: dict[str, Any]) -> TargetOutcome:
    answer = dict(api.call("PUT", _by_name(name), json=fields))
    secret = answer.pop("secret", None)
    if secret is not None:
        sys.stderr.write(f"target {name}: signing secret {secret} (store this secret now; it is shown once)\n")
        return TargetOutcome(name, str(answer["id"]), "+", answer=answer)
    changed = list(answer.get("changed") or [])
    return TargetOutcome(name, str(answer["id"]), "~" if changed else "=", changed, answer=answer)


def run_plan(api: ProblemKeepingClient, schedule_file: ScheduleFile, dry_run: bool, prune: bool) -> Outcome:
    """Puts the file's targets, then its set (module docstring); a dry run reads the targets and
    asks for the set's plan. A dry run cannot send a schedule whose target does not exist yet
    (it has no target_id): it is held back, and the server checks it only when applied."""
    target_ids = _server_targets(api, schedule_file)
    outcomes = []
    for name, fields in schedule_file.targets.items():
        try:
            outcome = (_dry_run_target if dry_run else _put_target)(api, name, fields)
        except ApiError:
            _report(api, schedule_file, [], ("targets", name))
            raise
        outcomes.append(outcome)
        if outcome.target_id is not None:
            target_ids[name] = outcome.target_id
    items, held_back = [], {}
    for key, fields in schedule_file.schedules.items():
        if fields["target"] not in target_ids:
            held_back[key] = fields["target"]
            continue
        job = {name: value for name, value in fields.items() if name != "target"}
        items.append({"key": key, "target_id": target_ids[fields["target"]], **job})
    if not items and held_back and not prune:
        return Outcome(schedule_file, dry_run, outcomes, None, held_back)
    path = f"/v1/schedule-sets/{quote(schedule_file.set, safe='')}"
    try:
        body = {"schedules": items, "prune": prune}
        answer = api.call("PUT", path, json=body, params={"dry_run": "true" if dry_run else "false"})
    except ApiError:
        _report(api, schedule_file, [item["key"] for item in items], ())
        raise
    # A schedule held back is in the file: it is not pruned.
    answer["pruned"] = [key for key in answer.get("pruned") or [] if key not in held_back]
    return Outcome(schedule_file, dry_run, outcomes, answer, held_back)


def plan_lines(outcome: Outcome) -> list[str]:
    """`+ target billing (created)`, then `+ key`, `~ key (fields)`, `= key`, `? key`, `- key`."""
    lines = []
    for target in outcome.targets:
        details = ["would be created" if outcome.dry_run else "created"] if target.mark == "+" else []
        details += [", ".join(target.changed)] if target.mark == "~" else []
        details += [f"not compared: {', '.join(target.not_compared)}"] if target.not_compared else []
        lines.append(f"{target.mark} target {target.name}" + (f" ({'; '.join(details)})" if details else ""))
    answer = outcome.answer or {}
    changed: dict[str, list[str]] = answer.get("changed") or {}
    for key in outcome.file.schedules:
        if key in outcome.held_back:
            lines.append(f"? {key} (target {outcome.held_back[key]} would be created first; not checked till then)")
        elif key in changed:
            lines.append(f"~ {key} ({', '.join(changed[key])})")
        elif key in (answer.get("created") or ()) or key in (answer.get("unchanged") or ()):
            lines.append(f"{'+' if key in answer['created'] else '='} {key}")
    return lines + [f"- {key}" for key in answer.get("pruned") or ()]


def _summary(outcome: Outcome) -> str:
    answer = outcome.answer or {}
    counts = [(len(answer.get(part) or ()), part) for part in ("created", "changed", "unchanged", "pruned")]
    told = ", ".join(f"{count} {part}" for count, part in [*counts, (len(outcome.held_back), "not checked")] if count)
    dry = " (dry run: nothing was written)" if outcome.dry_run else ""
    return f"set {outcome.file.set}{dry}: {told or 'no schedules'}"


def _as_json(outcome: Outcome) -> dict[str, Any]:
    """The server's answers: each target's (a PUT's without its secret; a dry run's GET), the set's."""
    targets = {t.name: t.shown() for t in outcome.targets}
    shown = {"set": outcome.file.set, "dry_run": outcome.dry_run, "targets": targets, "schedules": outcome.answer}
    return shown | {"not_checked": outcome.held_back}


def _planned(args: argparse.Namespace, dry_run: bool) -> Outcome:
    """Reads the file and applies it (or plans it, in a dry run). A file's mistakes, one a line,
    end the command with exit 2 (usage: the file as it is cannot be applied)."""
    try:
        text = Path(args.file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {args.file}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        schedule_file = parse_schedule_file(args.file, text, Path(args.file).stem)
        # Not the handler's client: this one keeps refusals' problem documents.
        client = ProblemKeepingClient(args.server, args.api_key)
        with client:
            return run_plan(client, schedule_file, dry_run, args.prune)
    except FileErrors as exc:
        sys.stderr.write("".join(error.text(args.file) + "\n" for error in exc.errors))
        raise UsageError(f"{args.file}: {len(exc.errors)} error(s); nothing was written") from None


def apply_verb(api: ApiClient, args: argparse.Namespace) -> None:
    outcome = _planned(args, dry_run=args.dry_run)
    if args.json:
        sys.stdout.write(json.dumps(_as_json(outcome), indent=2, sort_keys=True) + "\n")
    else:
        sys.stdout.write("".join(line + "\n" for line in [*plan_lines(outcome), _summary(outcome)]))


def diff_verb(api: ApiClient, args: argparse.Namespace) -> None:
    """`apply --dry-run` as a plan: exit 1 when something would change, 2 when it cannot tell."""
    try:
        outcome = _planned(args, dry_run=True)
    except ApiError as exc:
        if exc.exit_code == 1:
            raise Trouble(str(exc)) from None
        raise
    if args.json:
        sys.stdout.write(json.dumps(_as_json(outcome), indent=2, sort_keys=True) + "\n")
    else:
        header = [f"--- {api.url} set {outcome.file.set}", f"+++ {outcome.file.name}"]
        sys.stdout.write("".join(line + "\n" for line in [*header, *plan_lines(outcome)]))
    if changes := outcome.changes():
        sys.stdout.flush()
        apply = f"cronhook apply -f {outcome.file.name}" + (" --prune" if args.prune else "")
        raise Differs(f"{outcome.file.name}: {changes} change(s) to make ({apply})")


def export_document(api: ApiClient, set_name: str | None) -> tuple[dict[str, Any], list[str]]:
    """The file that, applied to this server, changes nothing; and the comments above it. A
    target with headers is left out: the server never shows their values, and a definition
    without them would drop them. Its schedules name it, and apply leaves it as it is."""
    schedules = api.pages("/v1/schedules", {"set": set_name}, None, SCHEDULES_PAGE_MAX, None).items
    targets = {tid: api.call("GET", f"/v1/targets/{tid}") for tid in dict.fromkeys(s["target_id"] for s in schedules)}
    names: dict[str, list[str]] = {}
    for target in targets.values():
        names.setdefault(target["name"], []).append(str(target["id"]))
    shared = [f"{', '.join(ids)} are all named {name!r}" for name, ids in names.items() if len(ids) > 1]
    if shared:
        raise ApiError(f"targets {'; '.join(shared)}: a file names targets, so rename all but one of each")
    comments = [f"cronhook export from {api.url}" + (f", set {set_name}" if set_name else "") + "; never a secret"]
    defined = {}
    for target in sorted(targets.values(), key=lambda t: str(t["name"])):
        if target.get("headers"):
            comments += [
                f"Target {target['name']!r} is not defined here: the server never shows its header values, and a",
                "definition without them would remove them. Its schedules name it; apply leaves it as it is.",
            ]
            continue
        defined[target["name"]] = {f: target[f] for f in EXPORTED_TARGET_FIELDS if target.get(f) not in (None, {})}
    by_key = {
        s["key"]: {"target": targets[s["target_id"]]["name"]}
        | {k: v for k, v in s.items() if k not in ("key", "set", "target_id") and v is not None}
        for s in sorted(schedules, key=lambda s: str(s["key"]))
    }
    return ({"set": set_name} if set_name else {}) | {"targets": defined, "schedules": by_key}, comments


def export_verb(api: ApiClient, args: argparse.Namespace) -> None:
    data, comments = export_document(api, args.set)
    text = json.dumps(data, indent=2) + "\n" if args.json else "".join(f"# {c}\n" for c in comments) + dump(data)
    if args.output is None:
        sys.stdout.write(text)
        return
    try:
        Path(args.output).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {args.output}: {exc.strerror}") from None
