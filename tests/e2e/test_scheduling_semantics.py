"""Misfire, overlap, interval modes and bounds, end to end: API, scheduler, a real receiver.

An outage is simulated by moving a job's schedule into the past, as if no scheduler had run
while its fire times passed; the scheduler is then driven with run_once().
"""

from __future__ import annotations

import datetime as dt
import inspect
import itertools
from collections.abc import Callable
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import pytest
from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.services.scheduler import Scheduler
from app.store.tables import jobs
from tests.conftest import make_job, make_target
from tests.e2e.test_delivery import drive, get_job, get_runs, job_state
from tests.problems import assert_problem
from tests.receiver import Receiver, Reply, wait_for


def scheduled_fors(receiver: Receiver) -> list[dt.datetime]:
    return [dt.datetime.fromisoformat(r.headers["cronhook-scheduled-for"]) for r in receiver.requests]


def scheduled_fors_of(receiver: Receiver, job_id: str) -> list[dt.datetime]:
    return [
        dt.datetime.fromisoformat(r.headers["cronhook-scheduled-for"])
        for r in receiver.requests
        if r.headers["cronhook-job-id"] == job_id
    ]


async def outage(engine: AsyncEngine, job_id: str, down_s: float, paused: bool = False) -> dt.datetime:
    """The job's first fire time was `down_s` ago and nothing ran since; returns it."""
    async with engine.begin() as conn:
        first: dt.datetime | None = await conn.scalar(select(func.now() - dt.timedelta(seconds=down_s)))
        times = {"schedule_anchor_at": first, "scheduled_for": first}
        await conn.execute(
            update(jobs).where(jobs.c.id == job_id).values(**times, **({} if paused else {"run_at": first}))
        )
    assert first is not None
    return first


async def outcomes(client: httpx.AsyncClient, auth: dict[str, str], job_id: str) -> list[str]:
    return [run["outcome"] for run in await get_runs(client, auth, job_id)]


async def start(client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, **fields: Any) -> dict[str, Any]:
    target = await make_target(client, auth, receiver.url(), timeout_s=3)
    return await make_job(client, auth, target["id"], **fields)


# Every minute, down for 10.5 minutes: fire times at -630 s, -570 s, ..., -30 s (11 of them),
# all beyond a 5 s grace.
OUTAGE_S = 630.0


async def test_skip_delivers_nothing_late_and_records_every_missed_fire_time(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, engine: AsyncEngine, scheduler: Scheduler
) -> None:
    job = await start(client, auth, receiver, every_s=60, misfire_policy="skip", misfire_grace_s=5)
    first = await outage(engine, job["id"], OUTAGE_S)
    await scheduler.run_once()
    assert receiver.requests == []
    after = await get_job(client, auth, job["id"])
    # Only the next future occurrence runs: on the same fixed-rate grid, 30 s from now.
    assert after["state"] == "scheduled"
    assert dt.datetime.fromisoformat(after["next_run_at"]) == first + dt.timedelta(seconds=660)
    runs = await get_runs(client, auth, job["id"])
    assert [r["outcome"] for r in runs] == ["missed"] * 11
    assert sorted(dt.datetime.fromisoformat(r["scheduled_for"]) for r in runs) == [
        first + dt.timedelta(seconds=60 * k) for k in range(11)
    ]


async def test_fire_once_delivers_the_latest_missed_occurrence_then_resumes(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, engine: AsyncEngine, scheduler: Scheduler
) -> None:
    job = await start(client, auth, receiver, every_s=60, misfire_grace_s=5)  # fire_once is the default
    assert job["misfire_policy"] == "fire_once" and job["overlap_policy"] == "forbid"
    first = await outage(engine, job["id"], OUTAGE_S)
    await drive(scheduler, lambda: len(receiver.requests) == 1, message="one catch-up delivery")
    assert scheduled_fors(receiver) == [first + dt.timedelta(seconds=600)]
    after = await get_job(client, auth, job["id"])
    assert dt.datetime.fromisoformat(after["next_run_at"]) == first + dt.timedelta(seconds=660)
    assert sorted(await outcomes(client, auth, job["id"])) == ["missed"] * 10 + ["success"]
    assert after["runs"] == 1


async def test_catch_up_delivers_each_missed_occurrence_up_to_its_cap(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, engine: AsyncEngine, scheduler: Scheduler
) -> None:
    job = await start(
        client, auth, receiver, every_s=60, misfire_policy="catch_up", misfire_grace_s=5, catch_up_limit=3
    )
    first = await outage(engine, job["id"], OUTAGE_S)

    async def caught_up() -> bool:
        state = await get_job(client, auth, job["id"])
        return dt.datetime.fromisoformat(state["next_run_at"]) > first + dt.timedelta(seconds=600)

    await drive(scheduler, caught_up, message="backlog delivered")
    # The three most recent occurrences, oldest first, each with its own webhook-id.
    assert scheduled_fors(receiver) == [first + dt.timedelta(seconds=s) for s in (480, 540, 600)]
    assert len({r.headers["webhook-id"] for r in receiver.requests}) == 3
    assert sorted(await outcomes(client, auth, job["id"])) == ["missed"] * 8 + ["success"] * 3


async def test_catch_up_keeps_its_backlog_when_a_catch_up_delivery_is_retried(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, engine: AsyncEngine, scheduler: Scheduler
) -> None:
    # overlap_policy forbid (the default) drops fire times that come due while an occurrence is
    # in flight; a backlog that was already due when it was first claimed is not that, even
    # when that first attempt fails and the retry finishes later.
    receiver.script = [Reply(status=502)]
    job = await start(
        client,
        auth,
        receiver,
        every_s=60,
        misfire_policy="catch_up",
        misfire_grace_s=5,
        catch_up_limit=3,
        backoff_base_s=0.05,
        backoff_max_s=0.1,
    )
    first = await outage(engine, job["id"], OUTAGE_S)

    async def waiting_for_the_future() -> bool:
        state = await get_job(client, auth, job["id"])
        future = dt.datetime.fromisoformat(state["scheduled_for"]) > first + dt.timedelta(seconds=600)
        return state["state"] == "scheduled" and future

    await drive(scheduler, waiting_for_the_future, message="backlog delivered")
    oldest, *rest = (first + dt.timedelta(seconds=s) for s in (480, 540, 600))
    assert scheduled_fors(receiver) == [oldest, oldest, *rest]  # the 502, its retry, then the rest
    assert sorted(await outcomes(client, auth, job["id"])) == ["http_error"] + ["missed"] * 8 + ["success"] * 3


async def test_an_occurrence_late_within_the_grace_is_on_time(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, engine: AsyncEngine, scheduler: Scheduler
) -> None:
    job = await start(client, auth, receiver, every_s=3600, misfire_policy="skip", misfire_grace_s=120)
    first = await outage(engine, job["id"], 60)
    await drive(scheduler, lambda: len(receiver.requests) == 1, message="late but within grace")
    assert scheduled_fors(receiver) == [first]
    assert await outcomes(client, auth, job["id"]) == ["success"]


async def test_overlap_forbid_skips_fire_times_that_come_due_during_a_slow_delivery(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler
) -> None:
    receiver.default = Reply(delay_s=2.5)
    # No misfire grace: a claim that busy cores delay past the next fire time settles the
    # missed ones by the misfire policy, so they are never mistaken for a backlog to deliver.
    job = await start(client, auth, receiver, every_s=1, misfire_grace_s=0)
    await drive(scheduler, lambda: len(receiver.requests) >= 2, timeout=60, message="two slow deliveries")
    times = scheduled_fors(receiver)
    # Two fire times came due while each 2.5 s delivery was in flight: skipped, not queued.
    assert times[1] - times[0] >= dt.timedelta(seconds=3)
    assert receiver.max_in_flight["/hook"] == 1  # deliveries never overlap
    runs = await outcomes(client, auth, job["id"])
    assert runs.count("skipped_overlap") >= 2


async def run_without_waiting(scheduler: Scheduler, until: Callable[[], object], timeout: float, message: str) -> None:
    """Scheduler passes that, like run_forever, do not wait for their deliveries to finish."""

    async def step() -> bool:
        await scheduler.tick()
        result = until()
        return bool(await result if inspect.isawaitable(result) else result)

    await wait_for(step, timeout=timeout, interval=0.05, message=message)


async def test_overlap_allow_delivers_fire_times_while_earlier_deliveries_are_in_flight(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler
) -> None:
    receiver.default = Reply(delay_s=2.5)
    job = await start(client, auth, receiver, every_s=1, overlap_policy="allow")
    await run_without_waiting(scheduler, lambda: len(receiver.requests) >= 4, 60, "four deliveries started")
    times = sorted(scheduled_fors(receiver))
    # Every fire time goes out, none skipped, while the 2.5 s deliveries before it are still
    # running. (Children started together may reach the receiver in either order.)
    assert [b - a for a, b in itertools.pairwise(times)] == [dt.timedelta(seconds=1)] * (len(times) - 1)
    assert max(receiver.max_in_flight.values()) >= 2
    assert len({r.headers["webhook-id"] for r in receiver.requests}) == len(receiver.requests)

    async def four_succeeded() -> bool:
        return (await outcomes(client, auth, job["id"])).count("success") >= 4

    await run_without_waiting(scheduler, four_succeeded, 60, "four deliveries recorded")
    # Each occurrence was delivered by a one-off child job; the schedule's runs list theirs.
    runs = [r for r in await get_runs(client, auth, job["id"]) if r["outcome"] == "success"]
    listed = await client.get("/v1/jobs", params={"parent_job_id": job["id"], "limit": 200}, headers=auth)
    children = {c["id"]: c for c in listed.json()["items"]}
    assert {r["job_id"] for r in runs} <= set(children) and len({r["job_id"] for r in runs}) == len(runs)
    finished = [c for c in children.values() if c["state"] == "succeeded"]
    assert len(finished) >= 4 and all(
        c["schedule_kind"] == "once" and c["parent_job_id"] == job["id"] for c in finished
    )
    assert "skipped_overlap" not in await outcomes(client, auth, job["id"])
    parent = await get_job(client, auth, job["id"])
    assert parent["state"] in ("scheduled", "running") and parent["runs"] >= 4


async def test_overlap_allow_still_honours_max_runs(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler
) -> None:
    receiver.default = Reply(delay_s=1.5)
    job = await start(client, auth, receiver, every_s=1, overlap_policy="allow", max_runs=2)

    async def ended() -> bool:
        return await job_state(client, auth, job["id"]) == "succeeded"

    await run_without_waiting(scheduler, ended, 60, "the schedule ended")
    await run_without_waiting(scheduler, lambda: len(receiver.requests) == 2, 60, "both occurrences delivered")
    assert (await get_job(client, auth, job["id"]))["ended_reason"] == "max_runs"

    async def both_recorded() -> bool:
        return await outcomes(client, auth, job["id"]) == ["success", "success"]

    await run_without_waiting(scheduler, both_recorded, 60, "both runs recorded")
    assert len(receiver.requests) == 2


async def test_fixed_rate_keeps_its_grid_while_fixed_delay_counts_from_each_finish(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler
) -> None:
    receiver.default = Reply(delay_s=1.0)
    rate = await start(client, auth, receiver, every_s=2, interval_mode="fixed_rate")
    delay = await start(client, auth, receiver, every_s=2, interval_mode="fixed_delay")

    def times_of(job: dict[str, Any]) -> list[dt.datetime]:
        return [
            dt.datetime.fromisoformat(r.headers["cronhook-scheduled-for"])
            for r in receiver.requests
            if r.headers["cronhook-job-id"] == job["id"]
        ]

    await drive(
        scheduler, lambda: len(times_of(rate)) >= 3 and len(times_of(delay)) >= 3, timeout=30, message="3 runs each"
    )
    rate_gaps = [b - a for a, b in zip(times_of(rate), times_of(rate)[1:], strict=False)]
    delay_gaps = [b - a for a, b in zip(times_of(delay), times_of(delay)[1:], strict=False)]
    # A 1 s delivery does not shift fixed-rate fire times: they stay on the 2 s grid (a
    # delivery that busy cores stretch past 2 s makes the next fire time an overlap, skipped
    # under the default forbid policy, so a gap may be a multiple of 2 s). Each fixed-delay
    # fire time is pushed back by the delivery before it.
    two = dt.timedelta(seconds=2)
    assert all(gap > dt.timedelta(0) and gap % two == dt.timedelta(0) for gap in rate_gaps), rate_gaps
    skipped = (await outcomes(client, auth, rate["id"])).count("skipped_overlap")
    assert sum(gap // two - 1 for gap in rate_gaps) <= skipped
    assert all(gap >= dt.timedelta(seconds=2.9) for gap in delay_gaps)


async def test_max_runs_and_end_at_end_a_job_succeeded_with_a_reason(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, engine: AsyncEngine, scheduler: Scheduler
) -> None:
    capped = await start(client, auth, receiver, every_s=1, max_runs=3)
    async with engine.connect() as conn:
        now = await conn.scalar(select(func.now()))
    assert now is not None
    # Anchored explicitly, so the two fire times before end_at do not depend on how long the
    # create took: start_at and start_at + 1 s; start_at + 2 s is past end_at.
    start_at = now + dt.timedelta(seconds=5)  # ahead even if creating the job is slow
    ending = await start(
        client,
        auth,
        receiver,
        every_s=1,
        start_at=start_at.isoformat(),
        end_at=(start_at + dt.timedelta(seconds=1.5)).isoformat(),
    )

    async def both_ended() -> bool:
        states = [(await get_job(client, auth, j["id"]))["state"] for j in (capped, ending)]
        return states == ["succeeded", "succeeded"]

    await drive(scheduler, both_ended, timeout=60, message="both jobs ended")
    final = await get_job(client, auth, capped["id"])
    assert (final["ended_reason"], final["runs"], final["next_run_at"]) == ("max_runs", 3, None)
    assert (await get_job(client, auth, ending["id"]))["ended_reason"] == "end_at"
    per_job = [r.headers["cronhook-job-id"] for r in receiver.requests]
    assert per_job.count(capped["id"]) == 3
    assert per_job.count(ending["id"]) == 2
    assert sorted(scheduled_fors_of(receiver, ending["id"])) == [start_at, start_at + dt.timedelta(seconds=1)]


@pytest.mark.date_sensitive
async def test_bounds_are_validated_and_start_at_sets_the_first_fire_time(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, engine: AsyncEngine
) -> None:
    target = await make_target(client, auth, receiver.url())
    async with engine.connect() as conn:
        now = await conn.scalar(select(func.now()))
    assert now is not None
    # 09:00 in Berlin about three years ahead, with the offset that holds on that day.
    local = (now + dt.timedelta(days=3 * 365)).astimezone(ZoneInfo("Europe/Berlin"))
    start = local.replace(hour=9, minute=0, second=0, microsecond=0)
    start_at = start.isoformat()
    job = await make_job(client, auth, target["id"], every_s=3600, start_at=start_at)
    assert dt.datetime.fromisoformat(job["next_run_at"]) == start
    day_before = (start - dt.timedelta(days=1)).isoformat()
    for fields, field in (
        ({"delay_s": 5, "max_runs": 2}, "max_runs"),
        ({"cron": "0 9 * * *", "interval_mode": "fixed_delay"}, "interval_mode"),
        ({"every_s": 60, "start_at": start_at, "end_at": day_before}, "end_at"),
        ({"every_s": 60, "end_at": "2001-01-01T00:00:00Z"}, "end_at"),
        ({"every_s": 60, "max_runs": 0}, "max_runs"),
        ({"every_s": 60, "misfire_policy": "sometimes"}, "misfire_policy"),
        ({"every_s": 60, "catch_up_limit": 0}, "catch_up_limit"),
    ):
        response = await client.post("/v1/jobs", json={"target_id": target["id"], **fields}, headers=auth)
        assert_problem(response, 422, field)


async def test_resume_applies_the_misfire_policy_to_what_was_missed_while_paused(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, engine: AsyncEngine, scheduler: Scheduler
) -> None:
    job = await start(client, auth, receiver, every_s=60, misfire_policy="skip", misfire_grace_s=5)
    await client.post(f"/v1/jobs/{job['id']}/pause", headers=auth)
    first = await outage(engine, job["id"], OUTAGE_S, paused=True)  # paused through 11 fire times
    await scheduler.run_once()
    assert receiver.requests == []
    resumed = await client.post(f"/v1/jobs/{job['id']}/resume", headers=auth)
    assert resumed.json()["state"] == "scheduled"
    await scheduler.run_once()
    assert receiver.requests == []  # skip: nothing late is delivered
    after = await get_job(client, auth, job["id"])
    assert dt.datetime.fromisoformat(after["next_run_at"]) == first + dt.timedelta(seconds=660)
    assert await outcomes(client, auth, job["id"]) == ["missed"] * 11
