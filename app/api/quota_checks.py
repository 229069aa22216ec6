"""Refusing a job that breaks its tenant's quotas: a 422 naming the field for a schedule or
retry policy below the tenant's floors, a 409 when the tenant has as many unfinished jobs as
it may."""

from __future__ import annotations

import datetime as dt
import uuid

from app.api.errors import Problem
from app.api.quotas import Quotas
from app.db.async_engine import AsyncConnection
from app.domain.quotas import TenantLimits, job_violations
from app.domain.retry import RetryPolicy
from app.domain.schedule import Schedule


async def ensure_job_within_quotas(
    conn: AsyncConnection,
    quotas: Quotas,
    tenant_id: uuid.UUID,
    schedule: Schedule,
    policy: RetryPolicy,
    now: dt.datetime,
    new_jobs: int = 1,
) -> None:
    check_job_within_limits(await quotas.limits(conn, tenant_id), schedule, policy, now)
    await ensure_room_for_jobs(conn, quotas, tenant_id, new_jobs)


def check_job_within_limits(limits: TenantLimits, schedule: Schedule, policy: RetryPolicy, now: dt.datetime) -> None:
    """422 naming the field for a job below the tenant's floors, with its limits at hand (a
    batch reads them once)."""
    violations = job_violations(limits, schedule, policy, now)
    if violations:
        first = violations[0]
        raise Problem(422, f"{first.field}: {first.message}", slug="validation", field=first.field)


async def ensure_room_for_jobs(conn: AsyncConnection, quotas: Quotas, tenant_id: uuid.UUID, new_jobs: int) -> None:
    """409 unless the tenant may have `new_jobs` more unfinished jobs (creates, triggers, replays)."""
    if not new_jobs:
        return
    limits = await quotas.limits(conn, tenant_id)
    if await quotas.active_jobs(conn, tenant_id) + new_jobs > limits.max_active_jobs:
        raise Problem(
            409,
            f"this tenant already has {limits.max_active_jobs} unfinished jobs, its limit",
            slug="quota-exceeded",
            extra={"limit": "max_active_jobs", "max_active_jobs": limits.max_active_jobs},
        )
    quotas.jobs_created(tenant_id, new_jobs)
