"""Vixie cron semantics through the API: the preview and a created job's next fire time come
from the same function, and refused forms are a 422 naming `cron`, with nothing written."""

from __future__ import annotations

import datetime as dt
from typing import Any

import httpx
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store.tables import jobs
from tests.conftest import make_job, make_target


async def preview(client: httpx.AsyncClient, auth: dict[str, str], cron: str, timezone: str, count: int) -> list[Any]:
    response = await client.get(
        "/v1/schedules/preview", params={"cron": cron, "timezone": timezone, "count": count}, headers=auth
    )
    assert response.status_code == 200, response.text
    fires: list[Any] = response.json()["fire_times"]
    return fires


async def test_preview_and_job_use_vixie_semantics(client: httpx.AsyncClient, auth: dict[str, str]) -> None:
    # A one-value range is that value: once a day at 09:00 Berlin time, not hourly.
    daily = await preview(client, auth, "0 9-9 * * *", "Europe/Berlin", 30)
    assert {dt.datetime.fromisoformat(f["at"]).time() for f in daily} == {dt.time(9)}
    assert len({dt.datetime.fromisoformat(f["at"]).date() for f in daily}) == 30

    # Day-of-month starts with *: Saturdays that are the 1st, 11th, 21st or 31st.
    saturdays = await preview(client, auth, "15 12 */10 * SAT", "UTC", 20)
    for fire in saturdays:
        local = dt.datetime.fromisoformat(fire["at"])
        assert local.isoweekday() == 6 and local.day in (1, 11, 21, 31)

    # Both restricted: the 28th-31st or the second Wednesday (was refused as "never fires").
    either = await preview(client, auth, "0 1 28-31 * 3#2", "UTC", 60)
    days = [dt.datetime.fromisoformat(f["at"]).date() for f in either]
    second_wednesdays = [d for d in days if d.isoweekday() == 3 and 8 <= d.day <= 14]
    month_ends = [d for d in days if d.day >= 28]
    assert second_wednesdays and month_ends
    assert len(second_wednesdays) + len(month_ends) == len(days)

    target = await make_target(client, auth, "http://127.0.0.1:9/hook")
    job = await make_job(client, auth, target["id"], cron="15 12 */10 * SAT", timezone="UTC")
    assert dt.datetime.fromisoformat(job["next_run_at"]) == dt.datetime.fromisoformat(saturdays[0]["utc"])


async def test_refused_cron_forms_are_a_422_naming_cron(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine
) -> None:
    target = await make_target(client, auth, "http://127.0.0.1:9/hook")
    for cron, reason in (
        ("0 0 * * L", "# and L are accepted only as d#k or dL"),
        ("0 0 L-3 * *", "L and W are accepted only as L, LW or nW"),
        ("0 0 * * 1#6", "out of range (1-5)"),
        ("0 0 ?/2 * *", "? stands for * and must be the whole field"),
    ):
        for response in (
            await client.get("/v1/schedules/preview", params={"cron": cron}, headers=auth),
            await client.post("/v1/jobs", json={"target_id": target["id"], "payload": {}, "cron": cron}, headers=auth),
        ):
            assert response.status_code == 422, response.text
            assert response.headers["content-type"].startswith("application/problem+json")
            errors = response.json()["errors"]
            assert [e["field"] for e in errors] == ["cron"]
            assert reason in response.text
    async with engine.connect() as conn:
        assert await conn.scalar(select(func.count()).select_from(jobs)) == 0
