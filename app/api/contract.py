"""The published OpenAPI contract: FastAPI's document, corrected where the routes alone cannot
say what the server does.

Every error answer is RFC 9457 problem+json (app/api/errors.py), so each operation declares
the one `Problem` schema under `application/problem+json` for every error status it can
return, instead of FastAPI's `HTTPValidationError`, and that schema declares every extension
member a problem can carry. No request model carries a `default`: generators take one as
"always present" and make the field required. A create model's default is said in the field's
description instead; an update (PATCH) model has none, since an absent field is left
unchanged. `servers` is set, and the webhook request cronhook sends is documented under
`webhooks` (app/api/contract_webhooks.py), so receivers can be generated from the same document.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from app.api.contract_webhooks import webhooks
from app.api.errors import PROBLEM_JSON
from app.api.schemas.jobs import RUN_OUTCOMES

# The members some problems add to RFC 9457's (`extra=` of app/api/errors.py's Problem), by name.
PROBLEM_EXTENSIONS: dict[str, dict[str, Any]] = {
    "job_id": {
        "type": "string",
        "format": "uuid",
        "description": "`duplicate-job` (409): the unfinished job that holds the dedup_key",
    },
    "state": {
        "$ref": "#/components/schemas/JobState",
        "description": "A 409 about a job's state (`job-finished`, `job-running`, `job-state`): the state it is in",
    },
    "outcome": {
        "anyOf": [{"type": "string", "enum": RUN_OUTCOMES}, {"type": "null"}],
        "description": "Completion reports: how the attempt ended, when known (409 `attempt-finished`, "
        "410 `attempt-fenced`)",
    },
    "children": {
        "type": "integer",
        "description": "`job-has-children` (409): how many unfinished jobs are chained after the job",
    },
    "limit": {
        "type": "string",
        "enum": ["max_active_jobs", "max_targets"],
        "description": "`quota-exceeded` (409): the tenant limit that was reached",
    },
    "max_active_jobs": {
        "type": "integer",
        "description": "`quota-exceeded` (409, `limit` max_active_jobs): the tenant's limit of unfinished jobs",
    },
    "max_targets": {
        "type": "integer",
        "description": "`quota-exceeded` (409, `limit` max_targets): the tenant's limit of targets",
    },
    "active_jobs": {
        "type": "integer",
        "description": "`target-in-use` (409): how many unfinished jobs still use the target",
    },
}

PROBLEM_SCHEMA: dict[str, Any] = {
    "title": "Problem",
    "type": "object",
    "description": "RFC 9457 problem details. `errors` names the offending fields, when there are any.",
    "required": ["type", "title", "status", "detail", "instance"],
    "properties": {
        "type": {"type": "string", "description": "urn:cronhook:problem:<slug>, or about:blank"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "instance": {"type": "string", "description": "The request path"},
        "errors": {
            "type": "array",
            "items": {"$ref": "#/components/schemas/ProblemFieldError"},
        },
        **PROBLEM_EXTENSIONS,
    },
    # Members added later are not a breaking change for clients generated today.
    "additionalProperties": True,
}
FIELD_ERROR_SCHEMA: dict[str, Any] = {
    "title": "ProblemFieldError",
    "type": "object",
    "required": ["field", "message"],
    "properties": {"field": {"type": "string"}, "message": {"type": "string"}},
}
PAYLOAD_SCHEMA: dict[str, Any] = {
    "title": "Payload",
    "type": "object",
    "additionalProperties": True,
    "description": "A JSON object, sent as the webhook's body",
}

ERROR_DESCRIPTIONS = {
    400: "Malformed request: the body is not JSON, or a cursor is invalid",
    401: "Missing or invalid API key",
    403: "The admin key is needed, or the admin API is disabled",
    404: "Not found (or owned by another tenant)",
    409: "Conflict with the resource's state",
    410: "The attempt has ended (rescued, retried, timed out or cancelled): the token is fenced",
    412: "If-Match or If-None-Match did not hold: it changed since that ETag, or exists, or does not",
    413: "Request body too large",
    422: "Invalid input; `errors` names each field",
    429: "Too many requests; see Retry-After",
    503: "The database is unavailable; retry after Retry-After",
}

# Conflicts only some operations can have: a job's state, a dedup_key, an Idempotency-Key
# reused with another body, a target that jobs still use, a tenant's quota of unfinished
# jobs or targets (`quota-exceeded`).
CONFLICTS = frozenset(
    {
        "createJob",
        "createJobs",
        "replayDeadLetter",
        "replayDeadLetters",
        "createTarget",
        "cancelJob",
        "pauseJob",
        "resumeJob",
        "triggerJob",
        "updateJob",
        "deleteTarget",
        "putTargetByName",
        "getTargetByName",
        "putSchedule",
        "deleteSchedule",
        "putScheduleSet",
    }
)
# Conditional requests (If-Match, If-None-Match): a precondition that does not hold is a 412.
CONDITIONAL_OPERATIONS = frozenset({"putTargetByName", "putSchedule"})
# Operations taking CRONHOOK_ADMIN_API_KEY: no tenant, so no tenant request rate (429).
ADMIN_OPERATIONS = frozenset(
    {
        "getCluster",
        "adminCreateApiKey",
        "adminListApiKeys",
        "adminRevokeApiKey",
        "adminGetTenantLimits",
        "adminSetTenantLimits",
        "adminPauseTenant",
        "adminResumeTenant",
    }
)
# Reports on an async attempt: no API key (the token is the capability), and their own
# refusals: an attempt already finished (409), ended otherwise (410), throttled (429).
COMPLETION_OPERATIONS = frozenset({"reportCompletion", "reportHeartbeat"})
# Operations that answer 404 for an unknown name in their query (`?tenant=`).
NOT_FOUND_BY_QUERY = frozenset({"adminListApiKeys"})
# Operations whose 422 can come only from the body or query, never from a path parameter.
UPDATE_MODELS = ("JobUpdate", "TargetUpdate", "DeadLetterReplay")


def error_statuses(operation: dict[str, Any]) -> list[int]:
    """The error statuses an operation can answer with, from what it takes."""
    op_id = operation.get("operationId", "")
    params = operation.get("parameters", [])
    statuses = {503}
    if operation.get("security"):
        statuses.add(401)
    if op_id in ADMIN_OPERATIONS:
        statuses |= {401, 403}
    elif operation.get("security"):
        # A tenant's request rate and failed authentications per address (app/api/deps.py).
        statuses.add(429)
    if any(p.get("in") == "path" for p in params) or op_id in NOT_FOUND_BY_QUERY:
        statuses |= {404, 422}
    if params:
        statuses.add(422)
    if any(p.get("name") == "cursor" for p in params):
        statuses.add(400)
    if "requestBody" in operation:
        statuses |= {400, 413, 422}
    if op_id in CONFLICTS:
        statuses.add(409)
    if op_id in CONDITIONAL_OPERATIONS:
        statuses.add(412)
    if op_id in COMPLETION_OPERATIONS:
        return sorted(statuses | {409, 410, 429})
    if not operation.get("security") and op_id not in ADMIN_OPERATIONS:
        statuses.discard(503)  # the probes answer their own way
    return sorted(statuses)


def _problem_response(status: int) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": ERROR_DESCRIPTIONS[status],
        "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}},
    }
    if status in (429, 503):
        response["headers"] = {"Retry-After": {"schema": {"type": "integer"}, "description": "Seconds"}}
    if status == 401:
        response["headers"] = {"WWW-Authenticate": {"schema": {"type": "string"}}}
    return response


# PATCH fields that cannot be removed: `null` is a 422 (app/api/routes/targets.py, job_control.py).
NOT_NULLABLE_ON_UPDATE = {"TargetUpdate": ("name", "url", "timeout_s"), "JobUpdate": ("target_id",)}


def _strip_defaults(name: str, schema: dict[str, Any]) -> None:
    """Absent means unchanged, so no defaults; and `null` only where it removes something."""
    for prop in schema.get("properties", {}).values():
        prop.pop("default", None)
    for field in NOT_NULLABLE_ON_UPDATE.get(name, ()):
        prop = schema["properties"][field]
        branches = [b for b in prop.pop("anyOf", []) if b.get("type") != "null"]
        if len(branches) == 1:
            prop.update(branches[0])


def request_models(doc: dict[str, Any]) -> set[str]:
    """The component schemas a request body can hold, directly or through another one."""
    schemas = doc["components"]["schemas"]
    found: set[str] = set()
    pending = [
        operation["requestBody"]
        for path_item in doc["paths"].values()
        for operation in path_item.values()
        if "requestBody" in operation
    ]
    while pending:
        for name in _references(pending.pop()):
            if name not in found and name in schemas:
                found.add(name)
                pending.append(schemas[name])
    return found


def _references(node: Any) -> set[str]:
    if isinstance(node, dict):
        ref = node.get("$ref")
        own = {ref.rsplit("/", 1)[-1]} if isinstance(ref, str) else set()
        return own.union(*(_references(value) for value in node.values()))
    if isinstance(node, list):
        return set().union(*(_references(item) for item in node))
    return set()


def _describe_defaults(schema: dict[str, Any]) -> None:
    """The server fills an absent field in: said in words, so the field stays optional."""
    for prop in schema.get("properties", {}).values():
        if "default" not in prop:
            continue
        default = prop.pop("default")
        if default is None:
            continue  # absent and null mean the same: nothing to say
        said = f"Default: {json.dumps(default)}."
        prop["description"] = f"{prop['description'].rstrip('.')}. {said}" if prop.get("description") else said


def _type_payloads(schemas: dict[str, Any]) -> None:
    schemas.pop("JsonValue", None)
    for schema in schemas.values():
        for prop in schema.get("properties", {}).values():
            if prop.get("$ref") == "#/components/schemas/JsonValue":
                # Any JSON value (a report's `result`): the empty schema says so, without a name.
                del prop["$ref"]
    for schema in schemas.values():
        prop = schema.get("properties", {}).get("payload")
        if prop is None:
            continue
        description = prop.get("description")
        prop.clear()
        prop["anyOf"] = [{"$ref": "#/components/schemas/Payload"}, {"type": "null"}]
        if description:
            prop["description"] = description
    schemas["Payload"] = PAYLOAD_SCHEMA


def contract(app: FastAPI, server_url: str) -> dict[str, Any]:
    doc = get_openapi(
        title=app.title,
        version=app.version,
        description=app.description,
        routes=app.routes,
        openapi_version="3.1.0",
        servers=[{"url": server_url, "description": "cronhook (CRONHOOK_HOST:CRONHOOK_PORT)"}],
    )
    schemas: dict[str, Any] = doc.setdefault("components", {}).setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    schemas["Problem"] = PROBLEM_SCHEMA
    schemas["ProblemFieldError"] = FIELD_ERROR_SCHEMA
    for name in UPDATE_MODELS:
        if name in schemas:
            _strip_defaults(name, schemas[name])
    for name in request_models(doc):
        _describe_defaults(schemas[name])
    _type_payloads(schemas)
    for path_item in doc["paths"].values():
        for operation in path_item.values():
            responses = operation["responses"]
            responses.pop("422", None)
            for status in error_statuses(operation):
                responses[str(status)] = _problem_response(status)
    doc["webhooks"] = webhooks(schemas)
    return doc
