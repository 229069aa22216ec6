"""A query or path parameter that PostgreSQL text cannot hold (a NUL) or that no name, key or
search contains (a control character) is refused with a 422 naming the parameter, on every
endpoint that takes free text there, and the same request without it answers. A NUL sent on
to PostgreSQL made a 500 (found by the schema fuzzer on `GET /v1/jobs?q=`)."""

from __future__ import annotations

import httpx

from tests.conftest import ADMIN
from tests.problems import assert_problem

BAD = ("a%00b", "%00", "a%01b", "a%7Fb")


async def test_a_tenants_free_text_parameters_refuse_nul_and_control_characters(
    client: httpx.AsyncClient, auth: dict[str, str]
) -> None:
    # (method, path with {} for the bad text, the parameter's name)
    cases = (
        ("GET", "/v1/jobs?q={}", "q"),
        ("GET", "/v1/schedules?set={}", "set"),
        ("GET", "/v1/schedules/{}", "key"),
        ("DELETE", "/v1/schedules/{}", "key"),
        ("PUT", "/v1/schedule-sets/{}", "set"),
        ("GET", "/v1/targets/by-name/{}", "name"),
    )
    for method, path, field in cases:
        good = await client.request(method, path.format("fine"), headers=auth, json={"schedules": []})
        assert good.status_code < 500 and good.status_code != 422, (path, good.text)
        for bad in BAD:
            response = await client.request(method, path.format(bad), headers=auth, json={"schedules": []})
            assert_problem(response, 422, field)


async def test_a_cursor_with_nul_or_control_characters_is_a_bad_cursor(
    client: httpx.AsyncClient, auth: dict[str, str]
) -> None:
    lists = ("/v1/jobs", "/v1/targets", "/v1/dead-letters", "/v1/schedules", "/v1/audit", "/v1/event-subscriptions")
    for path in lists:
        for bad in BAD:
            assert_problem(await client.get(f"{path}?cursor={bad}", headers=auth), 400, "cursor")


async def test_the_admin_tenant_parameters_refuse_nul_and_control_characters(admin_client: httpx.AsyncClient) -> None:
    cases = (  # the first creates the tenant the others find
        ("POST", "/v1/admin/tenants/{}/api-keys", "tenant"),
        ("GET", "/v1/admin/api-keys?tenant={}", "tenant"),
        ("GET", "/v1/admin/tenants/{}/limits", "tenant"),
        ("PUT", "/v1/admin/tenants/{}/limits", "tenant"),
    )
    for method, path, field in cases:
        body = {} if method != "POST" else {"name": "ci"}
        good = await admin_client.request(method, path.format("acme"), headers=ADMIN, json=body)
        assert good.status_code < 300, (path, good.text)
        for bad in BAD:
            response = await admin_client.request(method, path.format(bad), headers=ADMIN, json=body)
            assert_problem(response, 422, field)
