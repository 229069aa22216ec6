"""Signing-secret rotation with a grace period (issue 11 item 3): while it lasts, deliveries
carry two signatures, one per secret, so a receiver on either secret accepts them."""

from __future__ import annotations

import base64
import hashlib
import hmac

import httpx
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncEngine
from standardwebhooks.webhooks import Webhook

from app.services.scheduler import Scheduler
from app.store.tables import targets
from tests.conftest import make_job, make_target
from tests.e2e.test_delivery import drive
from tests.problems import assert_problem
from tests.receiver import Received, Receiver


def _signatures(request: Received) -> list[str]:
    return request.headers["webhook-signature"].split(" ")


def _expected(secret: str, request: Received) -> str:
    headers = request.headers
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + request.body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


async def test_both_secrets_sign_during_the_grace_period_then_only_the_new_one(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler, engine: AsyncEngine
) -> None:
    target = await make_target(client, auth, receiver.url())
    old = target["secret"]
    response = await client.post(f"/v1/targets/{target['id']}/rotate-secret", json={"grace_s": 3600}, headers=auth)
    assert response.status_code == 200, response.text
    new = response.json()["secret"]

    await make_job(client, auth, target["id"])
    await drive(scheduler, lambda: len(receiver.requests) >= 1, message="delivery during grace")
    request = receiver.requests[0]
    assert _signatures(request) == [_expected(new, request), _expected(old, request)]
    # Receivers using the reference library accept it with either secret.
    assert Webhook(old).verify(request.body, request.headers) == {"hello": "world"}
    assert Webhook(new).verify(request.body, request.headers) == {"hello": "world"}

    # Once the grace period is over, only the new secret signs.
    async with engine.begin() as conn:
        await conn.execute(update(targets).values(previous_secret_expires_at=targets.c.created_at))
    await make_job(client, auth, target["id"])
    await drive(scheduler, lambda: len(receiver.requests) >= 2, message="delivery after grace")
    after = receiver.requests[1]
    assert _signatures(after) == [_expected(new, after)]


async def test_rotation_without_grace_stops_the_old_secret_at_once(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler
) -> None:
    target = await make_target(client, auth, receiver.url())
    response = await client.post(f"/v1/targets/{target['id']}/rotate-secret", json={"grace_s": 0}, headers=auth)
    new = response.json()["secret"]
    await make_job(client, auth, target["id"])
    await drive(scheduler, lambda: len(receiver.requests) >= 1, message="delivery")
    assert _signatures(receiver.requests[0]) == [_expected(new, receiver.requests[0])]


async def test_rotation_grace_is_validated(client: httpx.AsyncClient, auth: dict[str, str]) -> None:
    target = await make_target(client, auth, "http://127.0.0.1:9/hook")
    response = await client.post(f"/v1/targets/{target['id']}/rotate-secret", json={"grace_s": -1}, headers=auth)
    assert_problem(response, 422, "grace_s")
    # No body: the default grace (24 h).
    assert (await client.post(f"/v1/targets/{target['id']}/rotate-secret", headers=auth)).status_code == 200
