"""Writing a target's definition: the create POST /v1/targets and a PUT by name share, the
change PATCH /v1/targets/{id} and a PUT share, and the upsert of
`PUT /v1/targets/by-name/{name}`, which makes the tenant's target of that name match the request.

A PUT states the whole definition (every field but the name, the defaults for those it leaves
out, as a create applies them), compared field by field with the target the name names:
- none yet: the target is created (201), and its signing secret is answered this once;
- nothing differs: nothing is written (200, `changed` empty);
- else the differing fields are changed as a PATCH changes them (200, `changed` names them).
A PUT never rotates nor answers the secret of a target that exists. Several live targets of
the name (names were never unique): 409, until all but one are renamed or deleted.

Every answer carries the definition's ETag; `If-Match` (the target must have that ETag) and
`If-None-Match` (`*`: only if no target has the name) make a PUT conditional (412 otherwise).
Concurrent PUTs of one name are serialised on the name (app/store/target_names.py).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import RowMapping

from app.api.errors import Problem
from app.api.quotas import Quotas
from app.api.schemas.targets import TargetDefinition, TargetUpdate
from app.db.async_engine import AsyncConnection
from app.domain.completion import CompletionMode
from app.keyring import KeyRing
from app.services.egress_resolver import url_refusal
from app.settings import Settings
from app.store import targets as store
from app.store.quotas import tenant_count_targets
from app.store.target_names import target_find_by_name, target_lock_by_name

NOT_FOUND = "target not found"
# A target's definition: the fields a PUT states, as the API names them (and the columns hold them).
DEFINITION = (
    "url",
    "headers",
    "timeout_s",
    "retry_on_status",
    "max_in_flight",
    "rate_per_s",
    "completion",
    "async_timeout_s",
    "heartbeat_timeout_s",
    "async_counts_in_flight",
    "labels",
    "auto_pause",
)
# Fields added to the definition after ETags were first given out: in the tag only when set,
# so a target that does not use them keeps its tag.
_TAGGED_WHEN_SET = ("auto_pause",)
# Fields PATCH cannot remove: `null` is a 422 (app/api/contract.py's NOT_NULLABLE_ON_UPDATE).
_NOT_NULLABLE = ("name", "url", "timeout_s", "completion", "async_counts_in_flight")
# Keys the ETag's MAC with one of its own, apart from the completion tokens' (same ring).
_ETAG_CONTEXT = b"cronhook target etag v1"


async def check_egress(settings: Settings, url: str | None) -> None:
    """Refuse internal destinations now, with a clear 422; delivery checks again (DNS changes)."""
    if url is not None and (refusal := await url_refusal(settings.egress_policy, url)) is not None:
        raise Problem(422, refusal, slug="validation", field="url")


def check_timeout(settings: Settings, timeout_s: float | None) -> None:
    if timeout_s is not None and timeout_s > settings.max_target_timeout_s:
        raise Problem(
            422,
            f"must be at most {settings.max_target_timeout_s:g} (CRONHOOK_MAX_TARGET_TIMEOUT_S)",
            slug="validation",
            field="timeout_s",
        )


def definition_of(body: TargetDefinition, settings: Settings) -> dict[str, Any]:
    """The definition a create stores for `body`: the one home of a target's defaults."""
    return {
        "url": body.url,
        "headers": body.headers or {},
        "timeout_s": body.timeout_s or settings.default_target_timeout_s,
        "retry_on_status": body.retry_on_status,
        "max_in_flight": body.max_in_flight,
        "rate_per_s": body.rate_per_s,
        "completion": (body.completion or CompletionMode.SYNC).value,
        "async_timeout_s": body.async_timeout_s,
        "heartbeat_timeout_s": body.heartbeat_timeout_s,
        "async_counts_in_flight": True if body.async_counts_in_flight is None else body.async_counts_in_flight,
        "labels": body.labels or {},
        "auto_pause": None if body.auto_pause is None else body.auto_pause.model_dump(),
    }


def row_definition(row: Any, key_ring: KeyRing) -> dict[str, Any]:
    """A stored target's definition, header values opened (compared and MACed, never shown)."""
    definition = {name: row[name] for name in DEFINITION if name != "auto_pause"}
    failures = row["auto_pause_failures"]
    definition["auto_pause"] = None if failures is None else {"consecutive_failures": failures}
    definition["headers"] = key_ring.open_headers(row["headers"] or {})
    definition["completion"] = str(row["completion"])
    return definition


def etag(row: Any, key_ring: KeyRing) -> str:
    """The definition's strong ETag: changes with any field of it (a header's value too), not
    with a rotated secret. A MAC under the key ring rather than a plain hash, so the tag tells
    nothing about the header values it covers; it changes once when the ring's first key does."""
    definition = row_definition(row, key_ring)
    for name in _TAGGED_WHEN_SET:
        if definition[name] is None:
            del definition[name]
    canonical = json.dumps(definition, sort_keys=True, separators=(",", ":"))
    key = hmac.new(key_ring.mac_keys[0], _ETAG_CONTEXT, hashlib.sha256).digest()
    return '"' + hmac.new(key, canonical.encode(), hashlib.sha256).hexdigest()[:32] + '"'


async def create_target(
    conn: AsyncConnection,
    key_ring: KeyRing,
    settings: Settings,
    quotas: Quotas,
    tenant_id: uuid.UUID,
    name: str,
    body: TargetDefinition,
) -> tuple[RowMapping, str]:
    """A new target (within the tenant's quota): its public row and its new signing secret."""
    check_timeout(settings, body.timeout_s)
    await check_egress(settings, body.url)
    limits = await quotas.limits(conn, tenant_id)
    if await tenant_count_targets(conn, tenant_id) >= limits.max_targets:
        raise Problem(
            409,
            f"this tenant already has {limits.max_targets} targets, its limit",
            slug="quota-exceeded",
            extra={"limit": "max_targets", "max_targets": limits.max_targets},
        )
    definition = definition_of(body, settings)
    return await store.target_create(
        conn,
        key_ring,
        tenant_id,
        name=name,
        url=definition["url"],
        headers=definition["headers"],
        timeout_s=definition["timeout_s"],
        retry_on_status=definition["retry_on_status"],
        max_in_flight=definition["max_in_flight"],
        rate_per_s=definition["rate_per_s"],
        completion={
            field: definition[field]
            for field in ("completion", "async_timeout_s", "heartbeat_timeout_s", "async_counts_in_flight")
        },
        labels=definition["labels"],
        auto_pause_failures=_auto_pause_failures(definition["auto_pause"]),
    )


def _auto_pause_failures(auto_pause: dict[str, int] | None) -> int | None:
    """The auto_pause_failures column of an auto_pause (null: none)."""
    return None if auto_pause is None else auto_pause["consecutive_failures"]


async def change_target(
    conn: AsyncConnection,
    key_ring: KeyRing,
    settings: Settings,
    tenant_id: uuid.UUID,
    target_id: uuid.UUID,
    body: TargetUpdate,
) -> RowMapping:
    """Changes the fields `body` sets (PATCH's semantics: an absent field is left as it is,
    `null` clears one that can be cleared); the row as it is now, 404 if no live target."""
    changes: dict[str, Any] = body.model_dump(exclude_unset=True)
    for field in _NOT_NULLABLE:
        if field in changes and changes[field] is None:
            raise Problem(422, "must not be null", slug="validation", field=field)
    if "headers" in changes and changes["headers"] is None:
        changes["headers"] = {}
    if "labels" in changes and changes["labels"] is None:
        changes["labels"] = {}
    if "auto_pause" in changes:
        changes["auto_pause_failures"] = _auto_pause_failures(changes.pop("auto_pause"))
    check_timeout(settings, changes.get("timeout_s"))
    await check_egress(settings, changes.get("url"))
    if not changes:
        row = await store.target_get(conn, tenant_id, target_id)
    else:
        row = await store.target_update(conn, key_ring, tenant_id, target_id, changes)
    if row is None:
        raise Problem(404, NOT_FOUND, slug="not-found")
    return row


def _ambiguous(name: str) -> Problem:
    return Problem(
        409,
        f"several targets are named {name!r}: rename or delete all but one",
        slug="ambiguous-name",
        field="name",
    )


async def named_target(conn: AsyncConnection, tenant_id: uuid.UUID, name: str) -> RowMapping:
    """The tenant's one live target named `name` (404 if none, 409 if several)."""
    found = await target_find_by_name(conn, tenant_id, name)
    if not found:
        raise Problem(404, f"no target is named {name!r}", slug="not-found")
    if len(found) > 1:
        raise _ambiguous(name)
    return found[0]


@dataclass(frozen=True)
class Upserted:
    row: RowMapping
    # The signing secret of a target the PUT created; None for one that existed.
    secret: str | None
    # The definition's fields that changed (all it set for a new target), as the API names them.
    changed: list[str]

    @property
    def created(self) -> bool:
        return self.secret is not None


def _names(header: str, tag: str) -> bool:
    """Whether an If-Match or If-None-Match value lists `tag`, or is `*` (strong comparison:
    a weak W/ tag never matches, RFC 9110 13.1.1)."""
    return any(item.strip() in ("*", tag) for item in header.split(","))


async def put_target(
    conn: AsyncConnection,
    key_ring: KeyRing,
    settings: Settings,
    quotas: Quotas,
    tenant_id: uuid.UUID,
    name: str,
    body: TargetDefinition,
    preconditions: tuple[str | None, str | None],
) -> Upserted:
    """Creates or changes the target `name` names (module docstring), in the request's transaction."""
    if_match, if_none_match = preconditions
    found = await target_lock_by_name(conn, tenant_id, name)
    if len(found) > 1:
        raise _ambiguous(name)
    if not found:
        if if_match is not None:
            raise Problem(412, f"no target is named {name!r} (If-Match)", slug="precondition-failed")
        row, secret = await create_target(conn, key_ring, settings, quotas, tenant_id, name, body)
        set_fields = sorted(k for k, v in definition_of(body, settings).items() if v is not None and v != {})
        return Upserted(row, secret, set_fields)
    row = found[0]
    tag = etag(row, key_ring)
    if if_none_match is not None and _names(if_none_match, tag):
        raise Problem(412, f"a target is already named {name!r} (If-None-Match)", slug="precondition-failed")
    if if_match is not None and not _names(if_match, tag):
        raise Problem(412, "the target has changed since that ETag (If-Match)", slug="precondition-failed")
    current, desired = row_definition(row, key_ring), definition_of(body, settings)
    changed = sorted(field for field in DEFINITION if current[field] != desired[field])
    if not changed:
        return Upserted(row, None, [])
    # Through PATCH's own path: its checks, the headers' sealing, a new rate's full bucket.
    update = TargetUpdate.model_validate({field: desired[field] for field in changed})
    return Upserted(await change_target(conn, key_ring, settings, tenant_id, row["id"], update), None, changed)
