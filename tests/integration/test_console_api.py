"""What the console reads besides the plain lists, on a real PostgreSQL: delivery statistics
drawn from the runs (per-minute buckets, totals, lateness percentiles of first attempts, the
busiest targets by name; one tenant's only, within the window), job search by id, name or
key, and dead letters that carry their job's name."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import make_job, make_target, new_tenant
from tests.problems import assert_problem

_RUN = text(
    """
INSERT INTO runs (job_id, tenant_id, occurrence_id, scheduled_for, attempt, started_at, finished_at, outcome,
                  status_code)
SELECT j.id, j.tenant_id, gen_random_uuid(), now() - make_interval(secs => :ago_s) - make_interval(secs => :late_s),
       :attempt, now() - make_interval(secs => :ago_s), now() - make_interval(secs => :ago_s), :outcome, :status
  FROM jobs j WHERE j.id = :job_id
"""
)


async def _run(
    engine: AsyncEngine, job_id: str, ago_s: float, outcome: str = "success", late_ms: float = 0, attempt: int = 1
) -> None:
    """A run that finished `ago_s` seconds ago, `late_ms` after its occurrence was due."""
    status = 200 if outcome == "success" else 500
    async with engine.begin() as conn:
        await conn.execute(
            _RUN,
            {
                "job_id": uuid.UUID(job_id),
                "ago_s": float(ago_s),
                "late_s": late_ms / 1000,
                "attempt": attempt,
                "outcome": outcome,
                "status": status,
            },
        )


async def test_delivery_stats_count_the_tenants_runs_in_the_window(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine
) -> None:
    billing = await make_target(client, auth, "http://127.0.0.1:9/hook", name="billing")
    exports = await make_target(client, auth, "http://127.0.0.1:9/hook", name="exports")
    pay = await make_job(client, auth, billing["id"], delay_s=3600, name="pay")
    dump = await make_job(client, auth, exports["id"], delay_s=3600, name="dump")
    # This hour: billing 3 attempts (1 failed, its retry succeeded), exports 1.
    await _run(engine, pay["id"], ago_s=120, late_ms=10)
    await _run(engine, pay["id"], ago_s=125, outcome="http_error", late_ms=30)
    await _run(engine, pay["id"], ago_s=119, attempt=2, late_ms=60_000)  # a retry: late by its backoff
    await _run(engine, dump["id"], ago_s=1800, late_ms=20)
    # Earlier today, and yesterday.
    await _run(engine, dump["id"], ago_s=3 * 3600, late_ms=5)
    await _run(engine, dump["id"], ago_s=30 * 3600, late_ms=5)
    # Another tenant's runs are not this tenant's.
    other = await new_tenant(engine)
    theirs = await make_target(client, other, "http://127.0.0.1:9/hook", name="theirs")
    await _run(engine, (await make_job(client, other, theirs["id"], delay_s=3600))["id"], ago_s=60)

    hour = await client.get("/v1/stats/deliveries", headers=auth)
    assert hour.status_code == 200, hour.text
    stats: dict[str, Any] = hour.json()
    assert (stats["window"], stats["bucket_s"]) == ("1h", 60)
    assert stats["totals"]["delivered"] == 3 and stats["totals"]["failed"] == 1
    # First attempts only: 10, 30 and 20 ms (the retry's minute of backoff is no lateness).
    assert stats["totals"]["lateness_p50_ms"] == 20.0
    assert 29 <= stats["totals"]["lateness_p99_ms"] <= 30
    assert sum(b["delivered"] for b in stats["buckets"]) == 3
    assert sum(b["failed"] for b in stats["buckets"]) == 1
    times = [dt.datetime.fromisoformat(b["at"]) for b in stats["buckets"]]
    assert times == sorted(times) and all(t.second == 0 and t.microsecond == 0 for t in times)
    now = dt.datetime.fromisoformat(stats["now"])
    assert all(now - dt.timedelta(hours=1, minutes=1) <= t <= now for t in times)
    assert [(t["name"], t["attempts"], t["failed"]) for t in stats["busiest_targets"]] == [
        ("billing", 3, 1),
        ("exports", 1, 0),
    ]

    day = (await client.get("/v1/stats/deliveries", headers=auth, params={"window": "24h"})).json()
    assert day["totals"]["delivered"] == 4 and day["totals"]["failed"] == 1
    assert [(t["name"], t["attempts"]) for t in day["busiest_targets"]] == [("billing", 3), ("exports", 2)]

    assert_problem(await client.get("/v1/stats/deliveries", headers=auth, params={"window": "7d"}), 422, "window")


async def test_delivery_stats_of_a_tenant_without_runs(client: httpx.AsyncClient, auth: dict[str, str]) -> None:
    stats = (await client.get("/v1/stats/deliveries", headers=auth)).json()
    assert stats["buckets"] == [] and stats["busiest_targets"] == []
    assert stats["totals"] == {
        "delivered": 0,
        "failed": 0,
        "lateness_p50_ms": None,
        "lateness_p95_ms": None,
        "lateness_p99_ms": None,
    }


async def test_jobs_found_by_id_name_or_key(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine
) -> None:
    target = await make_target(client, auth, "http://127.0.0.1:9/hook")
    report = await make_job(client, auth, target["id"], delay_s=600, name="Nightly-Report")
    await make_job(client, auth, target["id"], delay_s=600, name="sync_crm")
    keyed = await client.put(
        "/v1/schedules/warehouse-load", headers=auth, json={"target_id": target["id"], "every_s": 3600}
    )
    assert keyed.status_code in (200, 201), keyed.text

    async def found(q: str) -> list[str]:
        answer = await client.get("/v1/jobs", headers=auth, params={"q": q})
        assert answer.status_code == 200, answer.text
        return [job.get("name") or job.get("key") for job in answer.json()["items"]]

    assert await found("night") == ["Nightly-Report"]  # any case
    assert await found("REPORT") == ["Nightly-Report"]
    assert await found(report["id"]) == ["Nightly-Report"]
    assert await found("house") == ["warehouse-load"]
    # LIKE's wildcards are plain characters in a search.
    assert await found("_") == ["sync_crm"]
    assert await found("%") == []
    assert await found(str(uuid.uuid4())) == []
    # Another tenant's job is not found by its id.
    other = await new_tenant(engine)
    assert (await client.get("/v1/jobs", headers=other, params={"q": report["id"]})).json()["items"] == []
    assert_problem(await client.get("/v1/jobs", headers=auth, params={"q": ""}), 422, "q")
    assert_problem(await client.get("/v1/jobs", headers=auth, params={"q": "x" * 201}), 422, "q")
