"""The schedules file of `cronhook apply|diff|export` without a server: YAML read as JSON reads
it, each value's line, duplicate keys, the shape checks, a refusal's fields mapped back to
lines, the writer's round trip, the plan as printed, and the client's copies of the API's
rules held to the API's own."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.api.schedule_upserts import KEY_PATTERN
from app.api.schemas.targets import TargetDefinition
from app.api.target_upserts import DEFINITION, definition_of
from app.client import schedules_as_code as as_code
from app.client.yaml_lines import FileError, FileErrors, dump, field_path, load_document
from app.settings import Settings

EXAMPLE = """\
set: payments-nightly          # optional
targets:
  billing:
    url: https://billing.example.com/hooks/cron
    timeout_s: 10
    headers: {X-Team: payments}
schedules:
  nightly-report:
    target: billing
    cron: "H 3 * * *"
    timezone: Europe/Berlin
    payload: {report: daily}
  weekly-cleanup:
    target: billing
    every_s: 604800
  chained:
    target: ops
    after: {job_id: 0b6f8a0e-8f3c-4a59-9c39-5f4f1e0c2b11, on: failure}
"""


def parsed(text: str, name: str = "schedules.yaml") -> as_code.ScheduleFile:
    return as_code.parse_schedule_file(name, text, name.rsplit(".", 1)[0])


def errors_of(text: str, name: str = "schedules.yaml") -> list[str]:
    with pytest.raises(FileErrors) as raised:
        parsed(text, name)
    return [error.text(name) for error in raised.value.errors]


def test_the_example_file_reads_as_its_set_targets_and_schedules_with_the_line_of_each_field() -> None:
    schedules_file = parsed(EXAMPLE)
    assert schedules_file.set == "payments-nightly"
    assert schedules_file.targets == {
        "billing": {"url": "https://billing.example.com/hooks/cron", "timeout_s": 10, "headers": {"X-Team": "payments"}}
    }
    assert schedules_file.schedules["nightly-report"] == {
        "target": "billing",
        "cron": "H 3 * * *",
        "timezone": "Europe/Berlin",
        "payload": {"report": "daily"},
    }
    # YAML 1.1 would have made the chain's `on` the key True.
    assert schedules_file.schedules["chained"]["after"]["on"] == "failure"
    document = schedules_file.document
    assert document.line_of(("schedules", "nightly-report")) == 8
    assert document.line_of(("schedules", "nightly-report", "cron")) == 10
    assert document.line_of(("schedules", "nightly-report", "payload", "report")) == 12
    # A field the file does not state: the schedule's own line.
    assert document.line_of(("schedules", "weekly-cleanup", "jitter_s")) == 13
    assert document.line_of(("targets", "billing", "headers", "X-Team")) == 6


def test_the_set_defaults_to_the_files_name_and_must_be_spelled_as_a_key() -> None:
    assert parsed("schedules: {}\n", "nightly.yaml").set == "nightly"
    assert parsed("schedules:\n", "nightly.yaml").schedules == {}
    assert errors_of("schedules: {}\n", "Nightly Jobs.yaml") == [
        "Nightly Jobs.yaml:1: set: 'Nightly Jobs' (the file's name: give `set:`) must match "
        + as_code.KEY_PATTERN.pattern
    ]


def test_plain_scalars_follow_yaml_1_2_as_json_does() -> None:
    text = (
        "a: yes\nb: on\nc: 010\nd: 1e3\ne: 2030-01-01T09:00:00Z\nf: ~\ng: true\nh: 0x1f\ni: -.inf\n"
        "j: '010'\nk: 1.5\nl: -7\nm: 0o17\nn: No\n"
    )
    value = load_document(text).value
    assert value == {
        "a": "yes", "b": "on", "c": 10, "d": 1000.0, "e": "2030-01-01T09:00:00Z", "f": None, "g": True, "h": 31,
        "i": -math.inf, "j": "010", "k": 1.5, "l": -7, "m": 15, "n": "No",
    }  # fmt: skip


def test_json_is_read_too_tabs_and_all_with_its_lines() -> None:
    text = json.dumps({"set": "s", "schedules": {"a": {"target": "t", "every_s": 60}}}, indent="\t")
    schedules_file = parsed(text, "s.json")
    assert schedules_file.schedules == {"a": {"target": "t", "every_s": 60}}
    assert schedules_file.document.line_of(("schedules", "a", "every_s")) == 6


def test_a_key_given_twice_is_an_error_naming_both_lines_at_any_depth() -> None:
    text = """\
schedules:
  nightly:
    target: billing
    every_s: 60
    payload: {a: 1, a: 2}
  nightly:
    target: billing
    every_s: 120
"""
    assert errors_of(text) == [
        "schedules.yaml:5: schedules.nightly.payload.a: given twice (first on line 5)",
        "schedules.yaml:6: schedules.nightly: given twice (first on line 2)",
    ]


def test_merge_keys_merge_and_the_mappings_own_keys_win() -> None:
    text = """\
schedules:
  first: &defaults
    target: billing
    every_s: 60
    payload: {kind: base}
  second:
    <<: *defaults
    every_s: 120
"""
    schedules = parsed(text).schedules
    assert schedules["second"] == {"target": "billing", "every_s": 120, "payload": {"kind": "base"}}
    assert schedules["first"]["every_s"] == 60


def test_the_shape_is_checked_and_every_mistake_named_by_line_in_file_order() -> None:
    text = """\
set: payments
owner: team-payments
targets:
  billing:
    timeout_s: 10
  ops: https://ops.example.com
schedules:
  no-target:
    every_s: 60
  Bad_Key:
    target: billing
    every_s: 60
  with-id:
    target: billing
    target_id: 6f1c1c52-2a3f-4a3a-9c51-1d2b9f1d2e3a
    every_s: 60
  numbered:
    target: 12
"""
    pattern = as_code.KEY_PATTERN.pattern
    assert errors_of(text) == [
        "schedules.yaml:2: owner: unknown key: a file holds set, targets, schedules",
        "schedules.yaml:4: targets.billing: needs a url",
        "schedules.yaml:6: targets.ops: must be a mapping of fields",
        "schedules.yaml:8: schedules.no-target: needs a target (a target's name)",
        f"schedules.yaml:10: schedules.Bad_Key: the key must match {pattern}",
        "schedules.yaml:15: schedules.with-id.target_id: not in a file: it is `target` (a name)",
        "schedules.yaml:18: schedules.numbered.target: must be a target's name",
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("schedules: [a, b]\n", "schedules.yaml:1: schedules: must be a mapping, by key"),
        ("- a\n- b\n", "schedules.yaml:1: must be a mapping of set, targets and schedules"),
        ("schedules:\n  a: {target: t,\n", "schedules.yaml:3: not YAML: expected the node content"),
        ("schedules:\n  a:\n    target: t\n    payload: {1: one}\n", "schedules.yaml:4: schedules.a.payload: "),
        ("schedules:\n  a: !!binary aGk=\n", "schedules.yaml:2: schedules.a: the tag tag:yaml.org,2002:binary"),
        ("a: &a [*a]\n", "schedules.yaml:1: a[0]: an alias refers to the value that holds it"),
    ],
)
def test_a_file_that_is_not_a_schedules_file_says_where(text: str, expected: str) -> None:
    assert errors_of(text)[0].startswith(expected)


def test_an_empty_file_is_no_mapping() -> None:
    assert errors_of("") == ["schedules.yaml:1: must be a mapping of set, targets and schedules"]


def test_a_refusals_fields_point_at_the_lines_of_the_schedules_sent() -> None:
    document = parsed(EXAMPLE).document
    sent = ["nightly-report", "weekly-cleanup"]
    problem = {
        "status": 422,
        "detail": "invalid",
        "errors": [
            {"field": "schedules[0].cron", "message": "not a cron expression"},
            {"field": "schedules[1].jitter_s", "message": "too much jitter"},
            {"field": "schedules[1].target_id", "message": "no such target"},
            {"field": "schedules[0].payload.report", "message": "too long"},
            {"field": "set", "message": "reserved"},
        ],
    }
    lines = [error.text("s.yaml") for error in as_code.refusal_errors(problem, document, sent, ())]
    assert lines == [
        "s.yaml:1: set: reserved",
        "s.yaml:10: schedules.nightly-report.cron: not a cron expression",
        "s.yaml:12: schedules.nightly-report.payload.report: too long",
        "s.yaml:13: schedules.weekly-cleanup.jitter_s: too much jitter",
        "s.yaml:14: schedules.weekly-cleanup.target: no such target",
    ]


def test_a_conflict_names_the_schedule_and_a_targets_refusal_its_field() -> None:
    document = parsed(EXAMPLE).document
    detail = "the schedule 'weekly-cleanup' belongs to the set 'other'"
    conflict = {"status": 409, "detail": detail, "field": "schedules[1].key"}
    (error,) = as_code.refusal_errors(conflict, document, ["nightly-report", "weekly-cleanup"], ())
    assert error == FileError(13, "schedules.weekly-cleanup", detail)
    target_errors = [{"field": "headers.X-Team", "message": "reserved"}, {"field": "url"}]
    target = {"status": 422, "detail": "url: must include a host", "errors": target_errors}
    errors = as_code.refusal_errors(target, document, [], ("targets", "billing"))
    assert [e.text("s.yaml") for e in errors] == [
        "s.yaml:4: targets.billing.url: url: must include a host",
        "s.yaml:6: targets.billing.headers.X-Team: reserved",
    ]
    assert as_code.refusal_errors({"status": 409, "detail": "quota"}, document, [], ()) == []


def test_field_names_become_paths() -> None:
    assert field_path("after.job_id") == ("after", "job_id")
    assert field_path("jobs[3].cron") == ("jobs", 3, "cron")
    assert field_path("headers.X-Team") == ("headers", "X-Team")


_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63),
    st.floats(allow_nan=False),
    st.text(),
    st.sampled_from(["on", "yes", "No", "1e3", "010", "0o17", "0x1f", "2030-01-01", "null", "", "~", "<<", ".inf"]),
)
_VALUES = st.recursive(
    _SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3), max_leaves=12
)


@given(st.dictionaries(st.text(), _VALUES, max_size=4))
def test_what_dump_writes_reads_back_the_same(data: dict[str, Any]) -> None:
    assert load_document(dump(data)).value == data


def test_the_plan_is_printed_one_line_a_target_and_a_schedule() -> None:
    schedules_file = parsed(EXAMPLE)
    answer = {
        "set": "payments-nightly",
        "dry_run": True,
        "created": ["weekly-cleanup"],
        "changed": {"nightly-report": ["payload"]},
        "unchanged": [],
        "pruned": ["old"],
    }
    billing = as_code.TargetOutcome("billing", "id-1", "~", ["url"], ["header values"])
    outcome = as_code.Outcome(schedules_file, True, [billing], answer, {"chained": "ops"})
    assert as_code.plan_lines(outcome) == [
        "~ target billing (url; not compared: header values)",
        "~ nightly-report (payload)",
        "+ weekly-cleanup",
        "? chained (target ops would be created first; not checked till then)",
        "- old",
    ]
    assert outcome.changes() == 5


def test_the_clients_copies_of_the_api_rules_match_the_api() -> None:
    assert as_code.KEY_PATTERN.pattern == KEY_PATTERN
    assert set(as_code.EXPORTED_TARGET_FIELDS) == set(DEFINITION) - {"headers"}
    defaults = definition_of(TargetDefinition(url="https://billing.example.com"), Settings())
    assert as_code.TARGET_DEFAULTS == {k: v for k, v in defaults.items() if k not in ("url", "timeout_s")}


def test_a_key_or_set_name_with_a_trailing_newline_is_refused_before_anything_is_put() -> None:
    # A regex's `$` matches before a final newline: checked with it, "nightly\n" passed.
    text = (
        'set: "nightly\\n"\n'
        "targets:\n  billing:\n    url: https://billing.example.com\n"
        'schedules:\n  "daily\\n":\n    target: billing\n    every_s: 60\n'
    )
    pattern = as_code.KEY_PATTERN.pattern
    assert errors_of(text) == [
        f"schedules.yaml:1: set: 'nightly\\n' must match {pattern}",
        f"schedules.yaml:6: schedules.daily\n: the key must match {pattern}",
    ]
