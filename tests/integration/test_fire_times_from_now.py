"""The next fire time of a fixed-time cron job, as the API computes it from the database's
now, against an oracle that walks the zone's wall clock minute by minute (zoneinfo).

Which DST case a run exercises depends on the date it runs: CI runs this file again with
the clock injected just before spring-forward and fall-back transitions (.ci/run), where the
next 02:30 falls in a skipped hour (it fires when the clock resumes) or a repeated one (it
fires once, at the first 02:30).
"""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import make_job, make_target

ZONES = ["Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata", "UTC"]
MINUTE = dt.timedelta(minutes=1)


def next_daily_fire(now: dt.datetime, zone: ZoneInfo, at: dt.time) -> dt.datetime:
    """The first instant after `now` at which the zone's wall clock shows `at` or, on a day
    when `at` is skipped, the first minute past it (the README's DST policy)."""
    day_start = now.astimezone(zone).replace(hour=0, minute=0, second=0, microsecond=0) - dt.timedelta(days=1)
    instant = day_start.astimezone(dt.UTC)
    fired_on: set[dt.date] = set()
    while True:
        instant += MINUTE
        wall = instant.astimezone(zone)
        if wall.time() >= at and wall.date() not in fired_on:
            fired_on.add(wall.date())  # a repeated hour does not fire again that day
            if instant > now:
                return instant
        assert instant < now + dt.timedelta(days=3), "no fire time found"


@pytest.mark.date_sensitive
@pytest.mark.parametrize("zone", ZONES)
async def test_a_daily_cron_job_fires_next_at_the_wall_clock_time_of_its_zone(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine, zone: str
) -> None:
    target = await make_target(client, auth, "http://127.0.0.1:9/hook")
    async with engine.connect() as conn:
        before = await conn.scalar(select(func.now()))
    job = await make_job(client, auth, target["id"], cron="30 2 * * *", timezone=zone)
    async with engine.connect() as conn:
        after = await conn.scalar(select(func.now()))
    assert before is not None and after is not None
    got = dt.datetime.fromisoformat(job["next_run_at"])
    at = dt.time(2, 30)
    # Created at some instant between the two reads of the clock.
    assert got in {next_daily_fire(before, ZoneInfo(zone), at), next_daily_fire(after, ZoneInfo(zone), at)}, got
