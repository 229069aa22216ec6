"""Target URLs pointing inside the network are refused at create and update with a 422 naming
`url` (the default policy: CRONHOOK_EGRESS_ALLOW empty); `Expect` is refused as a header."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.app import create_app
from app.services.egress_resolver import DENIED_DETAIL, LEGACY_LITERAL_DETAIL
from app.settings import Settings
from app.store.tables import targets
from tests.conftest import make_target


@pytest.fixture
def settings(db_url: str) -> Settings:
    """The default every deployment gets: no internal destinations allowed."""
    return Settings(database_url=db_url, replica_id="egress-api", egress_allow="")


async def target_count(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        count = await conn.scalar(select(func.count()).select_from(targets))
    assert count is not None
    return count


def assert_refused_url(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    assert [e["field"] for e in body["errors"]] == ["url"], body
    return body


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/v1/targets",
        "http://127.0.0.1:5432/",
        "http://localhost:8080/",
        "http://[::1]/",
        "http://0.0.0.0/",
        "http://[::ffff:127.0.0.1]/",
        "http://[::ffff:7f00:1]/",
        "http://0x7f000001/",
        "http://2130706433/",
        "http://0177.0.0.1/",
        "http://127.1/",
        "http://169.254.169.254/latest/meta-data/",
        "http://[fd00:ec2::254]/",
        "http://metadata.google.internal/computeMetadata/v1/",
        "http://10.0.0.5/",
        "http://172.16.3.4/",
        "http://192.168.1.1/",
        "http://100.64.0.1/",
        "http://[fc00::1]/",
        "http://[fe80::1]/",
        "http://224.0.0.1/",
        "http://255.255.255.255/",
        "http://192.0.2.1/",
        "http://198.18.0.1/",
        "http://[64:ff9b::a9fe:a9fe]/",
    ],
)
async def test_internal_target_urls_are_refused_at_create(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine, url: str
) -> None:
    body = assert_refused_url(await client.post("/v1/targets", json={"name": "x", "url": url}, headers=auth))
    # One fixed text per kind of refusal: nothing tells which range matched.
    assert body["errors"][0]["message"] in (DENIED_DETAIL, LEGACY_LITERAL_DETAIL)
    assert await target_count(engine) == 0


async def test_an_update_to_an_internal_url_is_refused_and_changes_nothing(
    client: httpx.AsyncClient, auth: dict[str, str]
) -> None:
    # Does not resolve now: accepted, and checked again at every delivery.
    target = await make_target(client, auth, "https://hooks.example.invalid/a")
    for url in ("http://localhost/", "http://[::ffff:10.0.0.1]/", "http://0x0a000001/"):
        assert_refused_url(await client.patch(f"/v1/targets/{target['id']}", json={"url": url}, headers=auth))
    assert (await client.get(f"/v1/targets/{target['id']}", headers=auth)).json()["url"] == target["url"]
    ok = await client.patch(f"/v1/targets/{target['id']}", json={"url": "https://8.8.8.8/b"}, headers=auth)
    assert ok.status_code == 200 and ok.json()["url"] == "https://8.8.8.8/b"


async def test_the_allow_list_admits_what_it_names_and_nothing_else(engine: AsyncEngine, auth: dict[str, str]) -> None:
    settings = Settings(replica_id="egress-allow", egress_allow="10.0.0.0/8, billing.internal")
    transport = httpx.ASGITransport(app=create_app(settings, engine=engine))
    async with httpx.AsyncClient(transport=transport, base_url="http://cronhook.test") as client:
        for url in ("http://10.1.2.3:8443/hook", "http://billing.internal/hook", "http://[::ffff:10.9.9.9]/"):
            assert (await make_target(client, auth, url))["url"] == url
        for url in (
            "http://127.0.0.1/",
            "http://192.168.0.1/",
            "http://0x0a000001/",
            "http://metadata.google.internal/",
        ):
            assert_refused_url(await client.post("/v1/targets", json={"name": "x", "url": url}, headers=auth))


@pytest.mark.parametrize("name", ["Expect", "expect", "EXPECT"])
async def test_the_expect_header_is_refused_on_targets(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine, name: str
) -> None:
    body = {"name": "x", "url": "https://8.8.8.8/hook", "headers": {name: "100-continue"}}
    response = await client.post("/v1/targets", json=body, headers=auth)
    assert response.status_code == 422, response.text
    assert [e["field"] for e in response.json()["errors"]] == ["headers"]
    assert "Expect" in response.text
    assert await target_count(engine) == 0
    target = await make_target(client, auth, "https://8.8.8.8/hook")
    patched = await client.patch(f"/v1/targets/{target['id']}", json={"headers": {name: "100-continue"}}, headers=auth)
    assert patched.status_code == 422 and [e["field"] for e in patched.json()["errors"]] == ["headers"]
