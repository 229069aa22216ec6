"""Secrets at rest (issue 11 item 2): signing secrets and header values are sealed in the
database, open only with the key ring, re-seal under a new key, and start-up seals rows
stored in the clear and refuses a ring that cannot open what is stored."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr
from sqlalchemy import select, text, update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.keyring import (
    SIGNING_SECRET,
    KeyRingError,
    load_key_file,
    new_key_entry,
    parse_key_ring,
    sealed_key_id,
)
from app.runtime import Runtime
from app.settings import Settings
from app.store.tables import targets
from app.store.target_secrets import target_secrets_reseal
from tests.conftest import TEST_SECRET_KEYS, make_target

BEARER = "Bearer very-secret-downstream-token"


async def _dump(engine: AsyncEngine) -> str:
    """Every column of every target as text: what a SELECT or a plain backup shows."""
    async with engine.connect() as conn:
        rows = (await conn.execute(text("SELECT t::text FROM targets t"))).scalars().all()
    return "\n".join(rows)


async def _stored(engine: AsyncEngine) -> tuple[str, dict[str, str]]:
    async with engine.connect() as conn:
        row = (await conn.execute(select(targets.c.signing_secret, targets.c.headers))).one()
    return row.signing_secret, row.headers


async def test_no_secret_or_header_value_is_readable_in_the_database(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine
) -> None:
    target = await make_target(client, auth, "http://127.0.0.1:9/hook", headers={"Authorization": BEARER})
    rotated = (await client.post(f"/v1/targets/{target['id']}/rotate-secret", headers=auth)).json()["secret"]
    dump = await _dump(engine)
    for secret in (target["secret"], rotated, BEARER, "very-secret-downstream-token"):
        assert secret not in dump
        assert secret.removeprefix("whsec_") not in dump
    secret, headers = await _stored(engine)
    assert sealed_key_id(secret) == "test1" and sealed_key_id(headers["Authorization"]) == "test1"
    # The API still shows header names only, and replays of the create answer the secret.
    assert (await client.get(f"/v1/targets/{target['id']}", headers=auth)).json()["headers"] == {
        "Authorization": "<redacted>"
    }


async def test_rotating_the_sealing_key_reseals_everything_and_the_old_key_can_go(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine
) -> None:
    target = await make_target(client, auth, "http://127.0.0.1:9/hook", headers={"X-Token": "abc123"})
    new_entry = new_key_entry("k2")
    ring = parse_key_ring(f"{new_entry},{TEST_SECRET_KEYS}")
    assert await target_secrets_reseal(engine, ring, everything=True) == 1
    assert await target_secrets_reseal(engine, ring, everything=True) == 0  # nothing left to do
    secret, headers = await _stored(engine)
    assert sealed_key_id(secret) == "k2" and sealed_key_id(headers["X-Token"]) == "k2"
    only_new = parse_key_ring(new_entry)
    assert only_new.open(secret, SIGNING_SECRET) == target["secret"]
    with pytest.raises(KeyRingError, match="no key 'k2'"):
        parse_key_ring(TEST_SECRET_KEYS).open(secret, SIGNING_SECRET)


async def test_start_up_seals_rows_stored_in_the_clear(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine, settings: Settings
) -> None:
    target = await make_target(client, auth, "http://127.0.0.1:9/hook", headers={"X-Token": "abc123"})
    async with engine.begin() as conn:  # as rows were before encryption at rest
        await conn.execute(update(targets).values(signing_secret=target["secret"], headers={"X-Token": "abc123"}))
    runtime = Runtime(settings)
    try:
        await runtime.start(migrate=True)
        assert runtime.key_ring.primary_id == "test1"  # loaded once, handed down from here
    finally:
        await runtime.stop()
    assert target["secret"] not in await _dump(engine) and "abc123" not in await _dump(engine)
    secret, headers = await _stored(engine)
    assert sealed_key_id(secret) == "test1" and sealed_key_id(headers["X-Token"]) == "test1"


async def test_start_up_refuses_a_key_ring_that_cannot_open_stored_secrets(
    client: httpx.AsyncClient, auth: dict[str, str], settings: Settings
) -> None:
    await make_target(client, auth, "http://127.0.0.1:9/hook")
    other = settings.model_copy(update={"secret_keys": SecretStr(new_key_entry("other"))})
    runtime = Runtime(other)
    try:
        with pytest.raises(KeyRingError, match="test1"):
            await runtime.start(migrate=False)
    finally:
        await runtime.stop()
    with pytest.raises(KeyRingError, match="no key ring loaded"):
        runtime.key_ring  # noqa: B018 (refused: no ring was accepted)


def test_the_generated_key_file_is_private_and_stable(tmp_path: Path) -> None:
    first = load_key_file(tmp_path / "data")
    path = tmp_path / "data" / "secret-keys"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = load_key_file(tmp_path / "data")
    assert again.primary_id == first.primary_id
    assert again.open(first.seal("x", SIGNING_SECRET), SIGNING_SECRET) == "x"
    os.chmod(path, 0o644)
    with pytest.raises(KeyRingError, match="chmod 600"):
        load_key_file(tmp_path / "data")


def test_a_value_sealed_for_one_purpose_does_not_open_as_another() -> None:
    ring = parse_key_ring(TEST_SECRET_KEYS)
    sealed = ring.seal("token", "header_value")
    with pytest.raises(KeyRingError):
        ring.open(sealed, SIGNING_SECRET)


def test_malformed_key_rings_are_refused_with_a_clear_message() -> None:
    for spec, message in (
        ("nokey", "id:base64key"),
        ("a:" + "QUJD", "32 bytes"),
        ("a b:" + "QUJD" * 8 + "QUJDRA==", "key id"),
    ):
        with pytest.raises(KeyRingError, match=message):
            parse_key_ring(spec)
