"""`cronhook cron-check` as a real process against a real database: it lists exactly the
unfinished cron jobs whose next fire times changed with Vixie cron semantics."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import make_job, make_target

CRONHOOK = str(Path(sys.executable).with_name("cronhook"))


async def run_cron_check(db_url: str, *args: str) -> tuple[int, str]:
    env = {
        **os.environ,
        "CRONHOOK_DATABASE_URL": db_url,
        "CRONHOOK_AUTO_MIGRATE": "false",
        "CRONHOOK_LOG_LEVEL": "ERROR",
    }
    proc = await asyncio.create_subprocess_exec(
        CRONHOOK, "cron-check", *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode is not None
    assert proc.returncode in (0, 1), stderr.decode()
    return proc.returncode, stdout.decode()


async def test_cron_check_lists_the_jobs_whose_fire_times_changed(
    client: httpx.AsyncClient, auth: dict[str, str], db_url: str
) -> None:
    target = await make_target(client, auth, "http://127.0.0.1:9/hook")

    async def cron_job(cron: str, timezone: str = "UTC", **fields: Any) -> str:
        job = await make_job(client, auth, target["id"], cron=cron, timezone=timezone, **fields)
        return str(job["id"])

    # Hourly before the fix (croniter 7 read 9-9 as every hour), daily at 09:00 now.
    one_value_range = await cron_job("0 9-9 * * *", name="daily report")
    # Every 10th day OR Saturday before; Saturdays that are the 1st, 11th, 21st or 31st now.
    day_rule = await cron_job("15 12 */10 * SAT", "Europe/Berlin")
    await cron_job("0 9 * * 1-5", "America/New_York")  # unchanged
    await cron_job("0 0 LW * *")  # refused before the fix: created after it, nothing changed
    cancelled = await cron_job("0 9-9 * * *")
    response = await client.post(f"/v1/jobs/{cancelled}/cancel", headers=auth)
    assert response.status_code == 200, response.text

    status, out = await run_cron_check(db_url, "--json", "--fires", "10")
    *records, summary = [json.loads(line) for line in out.splitlines()]
    assert status == 1
    assert summary["cron_jobs"] == 4  # the cancelled job never fires again
    assert summary["changed"] == 2
    by_id = {record["job_id"]: record for record in records}
    assert set(by_id) == {one_value_range, day_rule}

    hourly = by_id[one_value_range]
    assert hourly["name"] == "daily report"
    assert hourly["state"] == "scheduled"
    assert {fire[11:] for fire in hourly["new_fires"]} == {"09:00:00Z"}
    assert len({fire[11:13] for fire in hourly["old_fires"]}) == len(hourly["old_fires"]) > 1
    saturdays = by_id[day_rule]
    assert saturdays["timezone"] == "Europe/Berlin"
    for fire in saturdays["new_fires"]:
        assert fire[8:10] in ("01", "11", "21", "31")

    status, text = await run_cron_check(db_url)
    assert status == 1
    assert text.startswith("2 of 4 unfinished cron jobs fire differently")
    assert "'0 9-9 * * *' in UTC: 1 job(s)" in text
    assert f"job {one_value_range} (tenant " in text
    assert f"job {day_rule} (tenant " in text
    assert cancelled not in text


async def test_cron_check_exits_0_when_nothing_changed(
    client: httpx.AsyncClient, auth: dict[str, str], db_url: str
) -> None:
    target = await make_target(client, auth, "http://127.0.0.1:9/hook")
    await make_job(client, auth, target["id"], cron="*/5 * * * *")
    await make_job(client, auth, target["id"], cron="0 12 L * *", timezone="Australia/Lord_Howe")
    status, out = await run_cron_check(db_url, "--json")
    assert status == 0
    assert [json.loads(line) for line in out.splitlines()][-1]["changed"] == 0


async def test_cron_check_rejects_a_bad_fires_count(db_url: str) -> None:
    env = {**os.environ, "CRONHOOK_DATABASE_URL": db_url}
    proc = await asyncio.create_subprocess_exec(
        CRONHOOK, "cron-check", "--fires", "0", env=env, stderr=asyncio.subprocess.PIPE
    )
    _, stderr = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 2
    assert b"--fires: must be a whole number from 1 to 1000" in stderr
