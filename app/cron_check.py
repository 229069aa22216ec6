"""`cronhook cron-check`: lists the stored cron jobs that fire differently since cron fields
mean what Vixie cron means (issue 13), so their owners can check them. Read-only.

Each unfinished cron job's next fire times from the database's now() are computed the old
way and the new way (app/domain/cron_migration.py); a job is listed when they differ, or
when its expression is now rejected (such a job is paused when the scheduler next loads
it, with the reason in `last_error`). Not listed: expressions the old code refused (`LW`,
`5L`), which only jobs created after the fix can have. Jobs sharing an expression and zone
are computed once.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from typing import TextIO

from app.db.async_engine import AsyncEngine
from app.domain.cron import MAX_UPCOMING
from app.domain.cron_migration import DEFAULT_FIRES, CronChange, compare
from app.store.cron_jobs import StoredCronJob, cron_job_list_unfinished

SHOWN_FIRES = 3
__all__ = ["DEFAULT_FIRES", "cron_check", "fires_arg"]


def fires_arg(text: str) -> int:
    """--fires: how many fire times to compare per job."""
    if not text.isdigit() or not 1 <= int(text) <= MAX_UPCOMING:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to {MAX_UPCOMING}")
    return int(text)


async def cron_check(engine: AsyncEngine, fires: int, out: TextIO, *, as_json: bool = False) -> int:
    """Writes the report to `out`; returns how many jobs fire differently."""
    async with engine.connect() as conn:
        now, stored = await cron_job_list_unfinished(conn)
    changes: dict[tuple[str, str], CronChange] = {}
    changed_jobs: list[tuple[StoredCronJob, CronChange]] = []
    for job in stored:
        key = (job.cron, job.timezone)
        if key not in changes:
            changes[key] = compare(job.cron, job.timezone, now, fires)
        # An expression the old code refused was stored after the fix: nothing changed for it.
        if changes[key].changed and changes[key].old_accepted:
            changed_jobs.append((job, changes[key]))

    if as_json:
        for job, change in changed_jobs:
            out.write(json.dumps(_job_record(job, change)) + "\n")
        out.write(json.dumps({"cron_jobs": len(stored), "changed": len(changed_jobs), "from": _iso(now)}) + "\n")
        return len(changed_jobs)

    out.write(
        f"{len(changed_jobs)} of {len(stored)} unfinished cron jobs fire differently now that cron fields mean "
        f"what Vixie cron means (next {fires} fire times from {_iso(now)} compared)\n"
    )
    by_expression: dict[tuple[str, str], list[StoredCronJob]] = {}
    for job, _ in changed_jobs:
        by_expression.setdefault((job.cron, job.timezone), []).append(job)
    for (expression, timezone), listed in by_expression.items():
        change = changes[(expression, timezone)]
        out.write(f"\n{expression!r} in {timezone}: {len(listed)} job(s)\n")
        out.write(f"    before: {_fires_text(change.old_fires, change.old_error, change.first_difference)}\n")
        out.write(f"    now:    {_fires_text(change.new_fires, change.new_error, change.first_difference)}\n")
        for job in listed:
            name = f" {job.name!r}" if job.name else ""
            out.write(f"    job {job.id} (tenant {job.tenant!r}{name}, {job.state})\n")
    return len(changed_jobs)


def _job_record(job: StoredCronJob, change: CronChange) -> dict[str, object]:
    start = change.first_difference or 0
    return {
        "job_id": str(job.id),
        "tenant": job.tenant,
        "name": job.name,
        "state": job.state,
        "cron": job.cron,
        "timezone": job.timezone,
        "first_difference": start,
        "old_fires": [_iso(t) for t in change.old_fires[start : start + SHOWN_FIRES]],
        "new_fires": [_iso(t) for t in change.new_fires[start : start + SHOWN_FIRES]],
        "old_error": change.old_error,
        "new_error": change.new_error,
    }


def _fires_text(fires: tuple[dt.datetime, ...], error: str | None, first_difference: int | None) -> str:
    if error is not None:
        return f"rejected: {error}"
    start = first_difference or 0
    shown = ", ".join(_iso(t) for t in fires[start : start + SHOWN_FIRES])
    return f"fire #{start + 1} on: {shown}" + (", ..." if len(fires) > start + SHOWN_FIRES else "")


def _iso(instant: dt.datetime) -> str:
    return instant.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
