"""The requests cronhook sends, as the OpenAPI document's `webhooks`: a delivery, with its
Standard Webhooks signature and cronhook's own headers; an async delivery, with its
completion URL (app/domain/completion.py); and one entry per event type (app/domain/
events.py), an event's delivery, signed as any, with its body's schema (app/api/schemas/
events.py). app/api/contract.py puts them in the contract."""

from __future__ import annotations

from typing import Any

from pydantic.json_schema import models_json_schema

from app.api.schemas.events import EVENT_BODIES
from app.domain.events import EVENT_MAX_ATTEMPTS


def _header(description: str, example: str) -> dict[str, Any]:
    return {
        "in": "header",
        "required": True,
        "schema": {"type": "string"},
        "description": description,
        "example": example,
    }


def webhook_operation() -> dict[str, Any]:
    headers = {
        "webhook-id": _header(
            "Standard Webhooks message id: the same for every attempt of one occurrence (use it to deduplicate)",
            "msg_2b7c1f0e9d3a4c5b8e6f7a1b2c3d4e5f",
        ),
        "webhook-timestamp": _header("Unix seconds when the attempt was made", "1767225600"),
        "webhook-signature": _header(
            "`v1,<base64 HMAC-SHA256>` over `<webhook-id>.<webhook-timestamp>.<body>` keyed with the target's secret "
            "(whsec_<base64 key>), per the Standard Webhooks specification",
            "v1,K5oZfzN95Z9UVu1EsfQmfVNQhnkZ2pj9o9NDN/H/pI4=",
        ),
        "cronhook-job-id": _header("The job (uuid)", "3f8e2a4c-0d1b-4a7e-9b2c-5d6e7f8a9b0c"),
        "cronhook-attempt": _header("Attempt number of this occurrence, from 1", "1"),
        "cronhook-scheduled-for": _header(
            "Nominal fire time of the occurrence (RFC 3339, UTC)", "2026-01-01T00:00:00Z"
        ),
        "cronhook-fire-at": _header(
            "When the occurrence was set to fire: cronhook-scheduled-for, or up to the job's jitter_s after it",
            "2026-01-01T00:00:07.250000Z",
        ),
        "cronhook-cause-id": {
            **_header(
                "An occurrence of a chained job (`after`) only: the webhook-id of the parent occurrence it runs after",
                "msg_9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d",
            ),
            "required": False,
        },
    }
    return {
        "post": {
            "operationId": "receiveWebhook",
            "summary": "The request cronhook POSTs to a target when a job fires",
            "description": "Sent as `Content-Type: application/json` with the target's own extra headers. A 2xx answer "
            "is success; 5xx, 408, 425, 429 and 3xx (redirects are never followed) are retried with backoff, "
            "unless the target sets `retry_on_status`; other statuses dead-letter the occurrence. At most 64 KB "
            "of the answer is read, within the target's `timeout_s`.",
            "parameters": [{"name": name, **spec} for name, spec in headers.items()],
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {"anyOf": [{"$ref": "#/components/schemas/Payload"}, {"type": "null"}]}
                    }
                },
                "description": "The job's payload, as given when it was created",
            },
            "responses": {"2XX": {"description": "Delivered"}},
        }
    }


def async_webhook_operation() -> dict[str, Any]:
    """The request to a target (or job) in `async` completion mode: the delivery's headers,
    and those of its completion URL."""
    operation = webhook_operation()["post"]
    completion_headers = {
        "cronhook-completion-url": _header(
            "Where to report this attempt: POST `<url>/heartbeat` (HeartbeatReport) while working, then POST `<url>` "
            "(CompletionReport). No API key: the token in the URL names this attempt only",
            "https://cron.example.com/v1/completions/ct1_x3Jv...",
        ),
        "cronhook-completion-signature": _header(
            "`v1,<base64 HMAC-SHA256>` over `<webhook-id>.<webhook-timestamp>.<completion url>` keyed with the "
            "target's secret: check it before reporting, as the body's signature",
            "v1,Wf0Pf9lQ3e5mN2xJm7pQeQ3tX0m6cE4iY5d8H1wq2rA=",
        ),
        "cronhook-completion-timeout": _header(
            "Seconds from this request within which the attempt must be reported (async_timeout_s)", "3600"
        ),
        "cronhook-heartbeat-timeout": {
            **_header("Seconds without a report (202, heartbeat) after which the attempt fails", "60"),
            "required": False,
        },
    }
    return {
        "post": {
            **operation,
            "operationId": "receiveAsyncWebhook",
            "summary": "The request cronhook POSTs to an async target: answer 202, then report",
            "description": "As `receiveWebhook`, with a completion URL. `202 Accepted` leaves the attempt open (the "
            "job shows `awaiting_completion`) until the receiver reports on the completion URL, or "
            "`cronhook-completion-timeout` (or, without heartbeats, `cronhook-heartbeat-timeout`) passes: then it "
            "fails and is retried with the same webhook-id and a new completion URL; the old one answers 410. Any "
            "other 2xx finishes the attempt at once, as a synchronous delivery.",
            "parameters": operation["parameters"]
            + [{"name": name, **spec} for name, spec in completion_headers.items()],
            "responses": {
                "202": {"description": "Accepted: the receiver reports the outcome on the completion URL"},
                "2XX": {"description": "Done: the attempt succeeded"},
            },
        }
    }


_EVENT_DELIVERY = (
    "Delivered as a one-off job to each subscribed target, signed with its secret as any delivery, and "
    f"retried with backoff ({EVENT_MAX_ATTEMPTS} attempts over about 36 minutes, then the dead-letter queue, "
    "where it can be replayed). The webhook-id is the event's: deduplicate by it. An event's own delivery is "
    "never the subject of another event."
)


def _operation_id(event_type: str) -> str:
    """`check.down` -> receiveCheckDownEvent."""
    words = event_type.replace("_", ".").split(".")
    return "receive" + "".join(word.capitalize() for word in words) + "Event"


def event_webhook_operations(schemas: dict[str, Any]) -> dict[str, Any]:
    """One webhook per event type, its body's schema added to `schemas` (the document's
    components)."""
    models = sorted(set(EVENT_BODIES.values()), key=lambda model: model.__name__)
    _, top = models_json_schema(
        [(model, "serialization") for model in models], ref_template="#/components/schemas/{model}"
    )
    schemas.update(top.get("$defs", {}))
    delivery = webhook_operation()["post"]
    operations: dict[str, Any] = {}
    for event_type, model in EVENT_BODIES.items():
        operations[event_type.value] = {
            "post": {
                "operationId": _operation_id(event_type.value),
                "summary": f"The `{event_type.value}` event, delivered to its subscribed targets",
                "description": f"{' '.join((model.__doc__ or '').split())} {_EVENT_DELIVERY}",
                "parameters": delivery["parameters"],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
                },
                "responses": {"2XX": {"description": "Received"}},
            }
        }
    return operations


def webhooks(schemas: dict[str, Any]) -> dict[str, Any]:
    """The document's `webhooks`: deliveries, async deliveries, then each event type."""
    return {
        "delivery": webhook_operation(),
        "asyncDelivery": async_webhook_operation(),
        **event_webhook_operations(schemas),
    }
