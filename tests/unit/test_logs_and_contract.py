"""Log line formats, and the OpenAPI contract's shape (errors, PATCH models, webhooks)."""

from __future__ import annotations

import json
import logging
import os
import pty
from typing import Any

import pytest

from app.api.app import create_app
from app.logs import (
    LOGGED_ONCE_ENV,
    REQUEST_ID,
    JsonFormatter,
    TextFormatter,
    configure_logging,
    log_once_per_command,
)
from app.settings import Settings


def _record(message: str, **extra: Any) -> logging.LogRecord:
    record = logging.LogRecord("uvicorn.error", logging.INFO, __file__, 1, message, (), None)
    record.__dict__.update(extra)
    return record


def test_json_lines_carry_no_terminal_colours_and_name_the_request() -> None:
    record = _record("Uvicorn running on \x1b[1mhttp://x\x1b[0m", color_message="\x1b[36m%d\x1b[0m", host="\x1b[1mh")
    token = REQUEST_ID.set("req-1")
    try:
        line = JsonFormatter().format(record)
    finally:
        REQUEST_ID.reset(token)
    entry = json.loads(line)
    assert "\\u001b" not in line and "color_message" not in entry
    assert (entry["event"], entry["host"], entry["request_id"]) == ("Uvicorn running on http://x", "h", "req-1")


def test_text_lines_read_as_event_then_fields() -> None:
    line = TextFormatter().format(_record("job_delivered", job_id="j1", attempt=2))
    assert line.split(" ", 1)[1] == "INFO    job_delivered job_id=j1 attempt=2"


def _formatter_for(stderr_is_a_terminal: bool, log_format: Any = "auto") -> logging.Formatter | None:
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    reader, writer = pty.openpty() if stderr_is_a_terminal else os.pipe()
    try:
        with os.fdopen(writer, "w") as stderr, pytest.MonkeyPatch.context() as patch:
            patch.setattr("sys.stderr", stderr)
            configure_logging("INFO", log_format)
            return root.handlers[0].formatter
    finally:
        root.handlers[:], root.level = saved
        os.close(reader)


def test_auto_log_format_is_text_on_a_terminal_and_json_otherwise() -> None:
    assert isinstance(_formatter_for(stderr_is_a_terminal=True), TextFormatter)
    assert isinstance(_formatter_for(stderr_is_a_terminal=False), JsonFormatter)
    # CRONHOOK_LOG_FORMAT wins either way.
    assert isinstance(_formatter_for(stderr_is_a_terminal=True, log_format="json"), JsonFormatter)
    assert isinstance(_formatter_for(stderr_is_a_terminal=False, log_format="text"), TextFormatter)


def test_a_start_up_notice_is_logged_once_per_command(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(LOGGED_ONCE_ENV, "")
    logger = logging.getLogger("app.cli")
    with caplog.at_level(logging.INFO):
        log_once_per_command(logger, "egress_internal_allowed", logging.WARNING, allowed="127.0.0.1/32")
        log_once_per_command(logger, "egress_internal_allowed", logging.WARNING, allowed="127.0.0.1/32")
        log_once_per_command(logger, "another_notice")
    assert [r.getMessage() for r in caplog.records] == ["egress_internal_allowed", "another_notice"]
    # A child of `--processes` starts with its parent's environment: it stays quiet.
    assert os.environ[LOGGED_ONCE_ENV] == "egress_internal_allowed,another_notice"


def _contract() -> dict[str, Any]:
    doc: dict[str, Any] = create_app(Settings()).openapi()
    return doc


def test_every_error_answer_is_declared_as_problem_json() -> None:
    doc = _contract()
    schemas = doc["components"]["schemas"]
    assert "HTTPValidationError" not in schemas and "ValidationError" not in schemas
    assert set(schemas["Problem"]["required"]) == {"type", "title", "status", "detail", "instance"}
    for path, item in doc["paths"].items():
        if not path.startswith("/v1/"):
            continue  # the probes answer with their own bodies
        for method, operation in item.items():
            errors = {int(s): r for s, r in operation["responses"].items() if s[0] in "45"}
            if path.startswith("/v1/completions/"):
                # No API key (the token is the capability); an ended attempt is a 409 or 410.
                assert 401 not in errors and {404, 409, 410, 429, 503} <= set(errors), (method, path)
            elif path.startswith("/v1/checks/ping/"):
                # No API key either (the ping URL's token); an unknown one is a 404, too many a 429.
                assert 401 not in errors and {404, 429, 503} <= set(errors), (method, path)
            else:
                assert {401, 503} <= set(errors), (method, path)
            if "{" in path:
                assert 404 in errors, (method, path)
            if "requestBody" in operation:
                assert {400, 413, 422} <= set(errors), (method, path)
            for response in errors.values():
                assert response["content"] == {
                    "application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}
                }
    assert 409 in {int(s) for s in doc["paths"]["/v1/jobs/{job_id}/cancel"]["post"]["responses"]}
    assert 403 in {int(s) for s in doc["paths"]["/v1/cluster"]["get"]["responses"]}
    assert doc["servers"][0]["url"].startswith("http://")


def test_update_models_have_no_defaults_and_payloads_are_objects() -> None:
    schemas = _contract()["components"]["schemas"]
    for name in ("JobUpdate", "TargetUpdate"):
        assert all("default" not in prop for prop in schemas[name]["properties"].values()), name
    # `null` only where it removes something: a target's name cannot be removed, its headers can.
    assert schemas["TargetUpdate"]["properties"]["name"]["type"] == "string"
    assert {"type": "null"} in schemas["TargetUpdate"]["properties"]["headers"]["anyOf"]
    assert schemas["Payload"]["type"] == "object"
    assert schemas["JobCreate"]["properties"]["payload"]["anyOf"][0] == {"$ref": "#/components/schemas/Payload"}


def test_the_webhook_request_is_documented() -> None:
    webhook = _contract()["webhooks"]["delivery"]["post"]
    headers = {p["name"] for p in webhook["parameters"] if p["in"] == "header"}
    assert {"webhook-id", "webhook-timestamp", "webhook-signature", "cronhook-job-id", "cronhook-attempt"} <= headers
    assert "application/json" in webhook["requestBody"]["content"]


def test_delivery_lines_are_capped_per_second_and_say_what_was_dropped() -> None:
    from app.metrics import RateLimitedLog

    limit = RateLimitedLog(per_s=100)
    verdicts = [limit.allow(10.0 + i / 1000) for i in range(250)]  # 250 within one second
    assert sum(allowed for allowed, _ in verdicts) == 100
    assert limit.allow(11.0) == (True, 150)  # the next second's first line reports the drop
    assert limit.allow(11.5) == (True, 0)
