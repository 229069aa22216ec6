"""The `Idempotency-Key` request header of the create endpoints.

A retry with the same key and the same body, from the same tenant, within 24 hours gets the
first response again (marked `Idempotent-Replayed: true`) and creates nothing; the same key
with another body is refused. The key is claimed in the request's transaction, so failed
requests (which roll back) leave nothing behind and concurrent duplicates wait for the
first one. Storage is in app/store/idempotency.py.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Header, Response
from pydantic import AfterValidator, BaseModel

from app.api.errors import Problem
from app.db.async_engine import AsyncConnection
from app.logs import log_event
from app.store.idempotency import (
    idempotency_key_claim,
    idempotency_key_get,
    idempotency_key_record_response,
)

logger = logging.getLogger(__name__)

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
MAX_KEY_LENGTH = 255


def _check_key(value: str | None) -> str | None:
    if value is not None and not (1 <= len(value) <= MAX_KEY_LENGTH and all("!" <= char <= "~" for char in value)):
        raise ValueError(f"must be 1 to {MAX_KEY_LENGTH} visible ASCII characters")
    return value


IdempotencyKey = Annotated[
    str | None,
    AfterValidator(_check_key),
    Header(
        alias=HEADER,
        description=(
            f"Makes a retry safe: 1 to {MAX_KEY_LENGTH} visible ASCII characters, unique per request (a UUID). "
            "Resending the same key with the same body within 24 hours returns the first response "
            f"(with `{REPLAYED_HEADER}: true`) and creates nothing; the same key with another body is a 422."
        ),
    ),
]

# For the create endpoints' `responses`, so the replay marker is in the OpenAPI document.
REPLAYED_RESPONSE_DOC: dict[int | str, dict[str, Any]] = {
    201: {
        "headers": {
            REPLAYED_HEADER: {
                "description": f"`true` when this is the stored response to an earlier request with this {HEADER}",
                "schema": {"type": "string", "enum": ["true"]},
            }
        }
    }
}


def request_hash(body: BaseModel) -> str:
    """SHA-256 of the validated body as canonical JSON: formatting and key order do not matter."""
    canonical = json.dumps(body.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class Replay:
    status_code: int
    body: Any

    def apply(self, response: Response) -> Any:
        """Sets the stored status and the replay marker on `response`; returns the stored body."""
        response.status_code = self.status_code
        response.headers[REPLAYED_HEADER] = "true"
        return self.body


@dataclass(frozen=True)
class IdempotentRequest:
    """One create request and its optional key; without a key both steps do nothing."""

    conn: AsyncConnection
    tenant_id: uuid.UUID
    endpoint: str
    key: str | None
    body: BaseModel

    async def begin(self) -> Replay | None:
        """Claims the key, or returns the response to replay. Call before doing any work."""
        if self.key is None:
            return None
        digest = request_hash(self.body)
        if await idempotency_key_claim(self.conn, self.tenant_id, self.endpoint, self.key, digest):
            return None
        record = await idempotency_key_get(self.conn, self.tenant_id, self.endpoint, self.key)
        if record is None:  # the claim locked the row for this transaction; it cannot vanish
            raise RuntimeError(f"idempotency key of {self.endpoint} disappeared while locked")
        if record.request_hash != digest:
            raise Problem(
                422,
                "this key was already used with a different request body; use a new key for a new request",
                slug="idempotency-key-reused",
                field=HEADER,
            )
        if record.status_code is None:
            # Only a request that committed without recording its response leaves this.
            raise Problem(
                409,
                "the request with this key did not complete; use a new key",
                slug="idempotency-key-in-use",
                field=HEADER,
            )
        log_event(logger, "idempotency_key_replayed", tenant_id=str(self.tenant_id), endpoint=self.endpoint)
        return Replay(record.status_code, record.response)

    async def finish(
        self, status_code: int, response: BaseModel | dict[str, Any], *, exclude: set[str] | None = None
    ) -> None:
        """Stores the response (a model, or JSON-ready dict) for replays, without the fields
        in `exclude` (secrets)."""
        if self.key is None:
            return
        if isinstance(response, BaseModel):
            stored = response.model_dump(mode="json", exclude=exclude)
        else:
            stored = {k: v for k, v in response.items() if k not in (exclude or set())}
        await idempotency_key_record_response(self.conn, self.tenant_id, self.endpoint, self.key, status_code, stored)
