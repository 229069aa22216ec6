"""A query or path parameter that PostgreSQL text cannot hold (a NUL) or that no name, key or
search contains (a control character, a trailing newline included) is refused with a 4xx
naming the parameter, on every endpoint that takes free text there, and the same request
with a plain value answers. A NUL sent on to PostgreSQL made a 500 (found by the schema fuzzer
on `GET /v1/jobs?q=`)."""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx

from tests.conftest import ADMIN, make_target
from tests.problems import assert_problem

BAD = ("a%00b", "%00", "a%01b", "a%7Fb")
Case = tuple[str, str, str, dict[str, Any] | None]


def text_cursor(value: str) -> str:
    """A well-formed cursor over keys (app/store/pagination.py, encode_cursor) holding `value`."""
    return base64.urlsafe_b64encode(json.dumps([value]).encode()).decode().rstrip("=")


async def test_a_tenants_free_text_parameters_refuse_nul_and_control_characters(
    client: httpx.AsyncClient, auth: dict[str, str]
) -> None:
    target = await make_target(client, auth, "http://127.0.0.1:9/hook")
    schedule = {"target_id": target["id"], "cron": "0 9 * * *"}
    # (method, path with {} for the text, the parameter's name, the body)
    cases: tuple[Case, ...] = (
        ("GET", "/v1/jobs?q={}", "q", None),
        ("GET", "/v1/jobs?label=team={}", "label", None),
        ("GET", "/v1/targets?label=team={}", "label", None),
        ("GET", "/v1/schedules?set={}", "set", None),
        ("PUT", "/v1/schedules/{}", "key", schedule),
        ("GET", "/v1/schedules/{}", "key", None),
        ("DELETE", "/v1/schedules/{}", "key", None),
        ("PUT", "/v1/schedule-sets/{}", "set", {"schedules": []}),
        ("GET", "/v1/targets/by-name/{}", "name", None),
    )
    for method, path, field, body in cases:
        good = await client.request(method, path.format("fine"), headers=auth, json=body)
        assert good.status_code < 500 and good.status_code != 422, (path, good.text)
        for bad in BAD:
            response = await client.request(method, path.format(bad), headers=auth, json=body)
            assert_problem(response, 422, field)


async def test_a_key_with_a_trailing_newline_is_refused(client: httpx.AsyncClient, auth: dict[str, str]) -> None:
    """A regex's `$` matches before a final newline: a key checked with it took "nightly\n"."""
    target = await make_target(client, auth, "http://127.0.0.1:9/hook")
    item = {"key": "nightly\n", "target_id": target["id"], "cron": "0 9 * * *"}
    response = await client.put("/v1/schedule-sets/nightly", headers=auth, json={"schedules": [item]})
    assert response.status_code == 422, response.text
    assert (await client.get("/v1/schedules", headers=auth)).json()["items"] == []


async def test_a_cursor_with_nul_or_control_characters_is_a_bad_cursor(
    client: httpx.AsyncClient, auth: dict[str, str]
) -> None:
    lists = ("/v1/jobs", "/v1/targets", "/v1/dead-letters", "/v1/schedules", "/v1/audit", "/v1/event-subscriptions")
    for path in lists:
        for bad in BAD:
            assert_problem(await client.get(f"{path}?cursor={bad}", headers=auth), 400, "cursor")
    # Well-formed cursors over schedule keys, holding what no key holds.
    assert (await client.get(f"/v1/schedules?cursor={text_cursor('a')}", headers=auth)).status_code == 200
    for value in ("a\x00", "\x00"):
        assert_problem(await client.get(f"/v1/schedules?cursor={text_cursor(value)}", headers=auth), 400, "cursor")


async def test_the_admin_tenant_parameters_refuse_nul_and_control_characters(admin_client: httpx.AsyncClient) -> None:
    cases: tuple[Case, ...] = (  # the first creates the tenant the others find
        ("POST", "/v1/admin/tenants/{}/api-keys", "tenant", {"name": "ci"}),
        ("GET", "/v1/admin/api-keys?tenant={}", "tenant", None),
        ("GET", "/v1/admin/tenants/{}/limits", "tenant", None),
        ("PUT", "/v1/admin/tenants/{}/limits", "tenant", {}),
        ("POST", "/v1/admin/tenants/{}/pause", "tenant", {}),
        ("POST", "/v1/admin/tenants/{}/resume", "tenant", {}),
    )
    for method, path, field, body in cases:
        good = await admin_client.request(method, path.format("acme"), headers=ADMIN, json=body)
        assert good.status_code < 300, (path, good.text)
        for bad in BAD:
            response = await admin_client.request(method, path.format(bad), headers=ADMIN, json=body)
            assert_problem(response, 422, field)
