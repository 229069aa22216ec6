"""Spreading fire times, end to end (API, scheduler, a real receiver on 127.0.0.1):
hashed cron values (`H`) resolved once per job and kept through restarts and edits, and
per-occurrence jitter that delays the fire time but never the nominal one.
"""

from __future__ import annotations

import datetime as dt
import itertools
import uuid
from collections import Counter
from typing import Any
from zoneinfo import ZoneInfo

import httpx
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.cron_hash import resolve_hashed
from app.domain.schedule import hash_seed
from app.services.scheduler import Scheduler
from app.store.tables import jobs
from tests.conftest import make_job, make_target
from tests.e2e.test_delivery import drive, get_job, get_runs
from tests.problems import assert_problem
from tests.receiver import Receiver

UTC = dt.UTC


def instant(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


async def tenant_of(engine: AsyncEngine, job_id: str) -> uuid.UUID:
    async with engine.connect() as conn:
        tenant = await conn.scalar(select(jobs.c.tenant_id).where(jobs.c.id == uuid.UUID(job_id)))
    assert isinstance(tenant, uuid.UUID)
    return tenant


async def test_a_jittered_occurrence_fires_within_its_bound_and_keeps_its_nominal_time(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler
) -> None:
    target = await make_target(client, auth, receiver.url(), timeout_s=3)
    job = await make_job(client, auth, target["id"], every_s=2, jitter_s=1)
    assert job["jitter_s"] == 1
    nominal, fires = instant(job["scheduled_for"]), instant(job["next_run_at"])
    assert nominal <= fires <= nominal + dt.timedelta(seconds=1)

    await drive(scheduler, lambda: len(receiver.requests) >= 4, timeout=30, message="four occurrences")
    await client.post(f"/v1/jobs/{job['id']}/pause", headers=auth)
    delays, nominals = [], []
    for request in receiver.requests[:4]:
        scheduled_for = instant(request.headers["cronhook-scheduled-for"])
        fire_at = instant(request.headers["cronhook-fire-at"])
        delays.append(fire_at - scheduled_for)
        nominals.append(scheduled_for)
        # Never before its own fire time (the clocks are one machine's).
        assert request.at >= fire_at.timestamp() - 0.05, (request.at, fire_at)
    assert all(dt.timedelta(0) <= d <= dt.timedelta(seconds=1) for d in delays), delays
    # Drawn per occurrence, not once per job.
    assert len(set(delays)) > 1, delays
    # The nominal times stay on the job's 2 s grid.
    assert nominals[0] == nominal
    assert [b - a for a, b in itertools.pairwise(nominals)] == [dt.timedelta(seconds=2)] * 3

    runs = [run for run in await get_runs(client, auth, job["id"]) if run["outcome"] == "success"][:4]
    headers = {instant(r.headers["cronhook-scheduled-for"]): r.headers["cronhook-fire-at"] for r in receiver.requests}
    for run in runs:
        assert run["fire_at"] is not None
        assert instant(run["fire_at"]) == instant(headers[instant(run["scheduled_for"])])


async def test_a_job_without_jitter_fires_at_its_nominal_time(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler
) -> None:
    target = await make_target(client, auth, receiver.url(), timeout_s=3)
    job = await make_job(client, auth, target["id"], delay_s=0.2)
    assert job["jitter_s"] is None and job["next_run_at"] == job["scheduled_for"]
    await drive(scheduler, lambda: len(receiver.requests) >= 1, timeout=30, message="delivered")
    (request,) = receiver.requests
    assert request.headers["cronhook-fire-at"] == request.headers["cronhook-scheduled-for"]
    (run,) = await get_runs(client, auth, job["id"])
    assert run["fire_at"] is None


async def test_jitter_is_refused_beyond_half_the_period_and_on_one_off_jobs(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver
) -> None:
    target = await make_target(client, auth, receiver.url())
    cases: list[dict[str, Any]] = [
        {"every_s": 60, "jitter_s": 31},
        {"cron": "*/10 * * * *", "jitter_s": 301},
        {"cron": "0 3 * * *", "jitter_s": 3601},
        {"delay_s": 60, "jitter_s": 5},
        {"every_s": 60, "jitter_s": -1},
    ]
    for fields in cases:
        answer = await client.post("/v1/jobs", headers=auth, json={"target_id": target["id"], **fields})
        assert_problem(answer, 422, "jitter_s")
    ok = await client.post("/v1/jobs", headers=auth, json={"target_id": target["id"], "every_s": 60, "jitter_s": 30})
    assert ok.status_code == 201, ok.text
    # A new schedule is held to the jitter the job keeps.
    answer = await client.patch(f"/v1/jobs/{ok.json()['id']}", headers=auth, json={"every_s": 10})
    assert_problem(answer, 422, "jitter_s")
    assert (await get_job(client, auth, ok.json()["id"]))["every_s"] == 60


async def test_hashed_cron_values_resolve_per_job_and_hold_across_restarts_and_edits(
    client: httpx.AsyncClient,
    auth: dict[str, str],
    receiver: Receiver,
    engine: AsyncEngine,
    scheduler: Scheduler,
) -> None:
    target = await make_target(client, auth, receiver.url())
    job = await make_job(client, auth, target["id"], cron="H H(2-5) * * *", timezone="Europe/Berlin")
    tenant = await tenant_of(engine, job["id"])
    assert job["cron"] == "H H(2-5) * * *"
    expected = resolve_hashed("H H(2-5) * * *", hash_seed(tenant, uuid.UUID(job["id"])))
    assert job["resolved_cron"] == expected
    minute, hour = (int(v) for v in expected.split()[:2])
    assert 0 <= minute <= 59 and 2 <= hour <= 5
    local = instant(job["next_run_at"]).astimezone(ZoneInfo("Europe/Berlin"))
    assert (local.hour, local.minute) == (hour, minute)

    # A scheduler pass (a restart reads the row afresh) and edits of other fields keep it.
    await scheduler.run_once()
    for change in ({"payload": {"v": 2}}, {"timezone": "UTC"}, {"max_attempts": 5}, {"misfire_grace_s": 30}):
        answer = await client.patch(f"/v1/jobs/{job['id']}", headers=auth, json=change)
        assert answer.status_code == 200, answer.text
        assert answer.json()["resolved_cron"] == expected, change
        assert answer.json()["cron"] == "H H(2-5) * * *"
    # A new expression with H in another field keeps this field's value.
    answer = await client.patch(f"/v1/jobs/{job['id']}", headers=auth, json={"cron": "H H(2-5) * * 1-5"})
    assert answer.json()["resolved_cron"].split()[:2] == expected.split()[:2]

    # The preview resolves as for the job when given its id, and needs a seed for H.
    preview = await client.get(
        "/v1/schedules/preview", headers=auth, params={"cron": "H H(2-5) * * *", "seed": job["id"].upper()}
    )
    assert preview.status_code == 200, preview.text
    assert preview.json()["cron"] == expected
    assert_problem(await client.get("/v1/schedules/preview", headers=auth, params={"cron": "H * * * *"}), 422, "seed")


async def test_invalid_hashed_values_are_refused_naming_cron(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver
) -> None:
    target = await make_target(client, auth, receiver.url())
    for cron in ("H(5-2) * * * *", "H/0 * * * *", "H(0-70) * * * *", "* * H#2 * *", "HH * * * *"):
        answer = await client.post("/v1/jobs", headers=auth, json={"target_id": target["id"], "cron": cron})
        assert_problem(answer, 422, "cron")
    # Nothing was half-written.
    assert (await client.get("/v1/jobs", headers=auth)).json()["items"] == []


async def test_a_thousand_hourly_jobs_written_with_h_spread_over_the_hour(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver
) -> None:
    target = await make_target(client, auth, receiver.url())
    for _ in range(10):
        batch = [{"target_id": target["id"], "cron": "H * * * *"} for _ in range(100)]
        answer = await client.post("/v1/jobs/batch", headers=auth, json={"jobs": batch})
        assert answer.status_code == 201, answer.text
    minutes: Counter[int] = Counter()
    cursor = None
    while True:
        params = {"limit": 200, **({"cursor": cursor} if cursor else {})}
        page = (await client.get("/v1/jobs", headers=auth, params=params)).json()
        for job in page["items"]:
            minute = int(job["resolved_cron"].split()[0])
            assert instant(job["next_run_at"]).minute == minute
            minutes[minute] += 1
        cursor = page.get("next_cursor")
        if not cursor:
            break
    assert sum(minutes.values()) == 1000
    mean = 1000 / 60
    assert len(minutes) >= 55, sorted(minutes)
    assert max(minutes.values()) <= 3 * mean, minutes.most_common(3)
