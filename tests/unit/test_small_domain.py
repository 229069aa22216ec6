"""Signing, partitions, the state table and settings validation."""

from __future__ import annotations

import base64
import collections
import pickle
import time
import uuid

import pytest
from pydantic import ValidationError
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from app.domain.partition import PARTITION_COUNT, partition_for
from app.domain.signing import SECRET_PREFIX, new_signing_secret, sign
from app.domain.states import TERMINAL_STATES, TRANSITIONS, JobState
from app.settings import Settings


def test_signature_verifies_with_the_reference_library_and_fails_when_tampered() -> None:
    secret = new_signing_secret()
    body = b'{"a":1}'
    timestamp = int(time.time())
    headers = {
        "webhook-id": "msg_1",
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(secret, "msg_1", timestamp, body),
    }
    assert Webhook(secret).verify(body, headers) == {"a": 1}
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(b'{"a":2}', headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(new_signing_secret()).verify(body, headers)


def test_secret_format_is_whsec_and_32_random_bytes() -> None:
    secret = new_signing_secret()
    assert secret.startswith(SECRET_PREFIX)
    assert len(base64.b64decode(secret.removeprefix(SECRET_PREFIX))) == 32
    assert secret != new_signing_secret()


def test_partition_is_stable_in_range_and_spread() -> None:
    job_id = uuid.UUID("12345678-1234-5678-1234-567812345678")
    assert partition_for(job_id) == partition_for(uuid.UUID(str(job_id)))
    counts = collections.Counter(partition_for(uuid.uuid4()) for _ in range(PARTITION_COUNT * 50))
    assert set(counts) <= set(range(PARTITION_COUNT))
    assert len(counts) > PARTITION_COUNT * 0.95
    assert max(counts.values()) < 50 * 3


def test_terminal_states_have_no_way_out_and_others_can_be_cancelled() -> None:
    for state in JobState:
        if state in TERMINAL_STATES:
            assert TRANSITIONS[state] == frozenset()
        else:
            assert JobState.CANCELLED in TRANSITIONS[state]
    assert JobState.SCHEDULED in TRANSITIONS[JobState.RUNNING]
    assert JobState.SUCCEEDED not in TRANSITIONS[JobState.SCHEDULED]


def test_lease_shorter_than_http_deadline_is_refused_at_start() -> None:
    with pytest.raises(ValidationError, match="CRONHOOK_LEASE_S"):
        Settings(lease_s=20, max_target_timeout_s=30)
    assert Settings(lease_s=40, max_target_timeout_s=30).lease_s == 40


def test_a_claim_ahead_longer_than_a_posts_start_window_is_refused_at_start() -> None:
    # lease 35.5 - timeout 30 - margin 5: a claimed job's POST may start within 0.5 s.
    with pytest.raises(ValidationError, match="CRONHOOK_CLAIM_AHEAD_S"):
        Settings(lease_s=35.5, max_target_timeout_s=30, lease_margin_s=5, claim_ahead_s=0.5)
    assert Settings(lease_s=35.5, max_target_timeout_s=30, lease_margin_s=5, claim_ahead_s=0.4).claim_ahead_s == 0.4


@pytest.mark.parametrize(
    ("sqlstate", "transient"),
    [
        ("57P03", True),
        ("57P01", True),
        ("08006", True),
        ("23505", False),
        ("57014", True),
        ("53300", True),
        (None, False),
    ],
)
def test_a_server_shutting_down_is_an_outage_and_a_constraint_violation_is_not(
    sqlstate: str | None, transient: bool
) -> None:
    from sqlalchemy.exc import DBAPIError

    from app.db.errors import is_transient_db_error

    class DriverError(Exception):
        sqlstate: str | None = None

    orig = DriverError("the database system is shutting down")
    orig.sqlstate = sqlstate
    assert is_transient_db_error(DBAPIError("SELECT 1", {}, orig)) is transient


def test_schedule_kinds_in_the_contract_are_the_enum() -> None:
    import typing

    from app.api.schemas.jobs import JobPublic
    from app.domain.schedule import ScheduleKind

    # The database no longer re-checks the spelling (migration 0024): the enum is the one list.
    contract = typing.get_args(JobPublic.model_fields["schedule_kind"].annotation)
    assert set(contract) == {kind.value for kind in ScheduleKind}


def test_a_connection_the_server_closed_is_reported_as_a_failed_connection() -> None:
    from sqlalchemy.exc import InterfaceError

    from app.db.errors import is_transient_db_error, outage_reason

    closed = InterfaceError("SELECT 1", {}, Exception("cannot call Connection.fetch(): connection is closed"))
    assert is_transient_db_error(closed)
    assert outage_reason(closed).startswith("the connection to the database failed")


def test_fast_ids_are_the_version_4_uuids_of_their_random_bits() -> None:
    from app import ids

    for raw in (bytes(16), bytes(range(16)), b"\xff" * 16):
        # What uuid.UUID's own constructor makes of the same bits: equal, same hash, same text.
        made, reference = ids._v4(int.from_bytes(raw)), uuid.UUID(bytes=raw, version=4)
        assert (made, hash(made), str(made), made.is_safe) == (
            reference,
            hash(reference),
            str(reference),
            reference.is_safe,
        )
    many = ids.new_ids(2000) + [ids.new_id() for _ in range(50)]
    assert len(set(many)) == len(many)
    for one in many:
        assert (one.version, one.variant) == (4, uuid.RFC_4122)
        assert uuid.UUID(str(one)) == one and pickle.loads(pickle.dumps(one)) == one


def test_a_job_payload_holds_json_values_only() -> None:
    from app.api.schemas.jobs import JobCreate

    target = str(uuid.uuid4())
    fine = {"s": "x", "n": 1, "f": 1.5, "b": True, "none": None, "list": [1, {"k": []}], "o": {}}
    assert JobCreate.model_validate({"target_id": target, "delay_s": 1, "payload": fine}).payload == fine
    # From JSON text these cannot arise; from Python they must not slip through to the INSERT.
    for bad in ({"at": time.gmtime()}, {"set": {1}}, {"o": {1: "key"}}, {"n": float("nan")}, {"s": "\x00"}):
        with pytest.raises(ValidationError) as refused:
            JobCreate.model_validate({"target_id": target, "delay_s": 1, "payload": bad})
        assert refused.value.errors()[0]["loc"][0] == "payload"
