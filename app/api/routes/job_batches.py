"""POST /v1/jobs/batch: many creates in one transaction and (nearly) one INSERT.

All or nothing for input: every item is validated and planned before anything is written, and
a bad item (or an unknown target) is a 422 naming `jobs[i].field`. Conflicts are per item: a
job whose dedup_key an unfinished job holds (one of the tenant's, or an earlier item of the
same batch) is not created and is reported with that job's id, while the others are created.
The answer is 201 when every item was created, 207 when some were not; `items` holds one
result per job, in order.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from app.api.audit import Audited
from app.api.checks import ensure_payload_fits
from app.api.deps import Caller, Conn, QuotasDep, SettingsDep
from app.api.errors import Problem
from app.api.idempotency import REPLAYED_HEADER, REPLAYED_RESPONSE_DOC, IdempotencyKey, IdempotentRequest
from app.api.quota_checks import check_job_within_limits, ensure_room_for_jobs
from app.api.schemas.job_batches import JobBatchCreate, JobBatchResult
from app.domain.job_plan import PlanError, plan_create
from app.domain.schedule import ScheduleError
from app.ids import new_ids
from app.store.job_inserts import job_create_many_checked
from app.store.job_layout import PreparedJob
from app.store.targets import target_lock_live_many

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

BATCH_PATH = "/v1/jobs/batch"
ENDPOINT = f"POST {BATCH_PATH}"
_MULTI_STATUS_DOC: dict[int | str, dict[str, Any]] = {
    207: {"model": JobBatchResult, "description": "Some items were not created (dedup_key conflicts)"},
}


@router.post(
    "/batch",
    status_code=201,
    operation_id="createJobs",
    response_model=JobBatchResult,
    responses={**REPLAYED_RESPONSE_DOC, **_MULTI_STATUS_DOC},
    # One audit row per batch, in the batch's transaction.
    dependencies=[Audited],
)
async def create_jobs(
    body: JobBatchCreate,
    caller: Caller,
    conn: Conn,
    settings: SettingsDep,
    quotas: QuotasDep,
    idempotency_key: IdempotencyKey = None,
) -> Any:
    tenant_id = caller.tenant_id
    idempotent = IdempotentRequest(conn, tenant_id, ENDPOINT, idempotency_key, body)
    if (replay := await idempotent.begin()) is not None:
        return JSONResponse(replay.body, status_code=replay.status_code, headers={REPLAYED_HEADER: "true"})
    defaults = settings.default_retry_policy
    # Each job against the tenant's floors (schedule, retry policy); the count below.
    limits = await quotas.limits(conn, tenant_id)
    batch: list[PreparedJob] = []
    for index, (item, job_id) in enumerate(zip(body.jobs, new_ids(len(body.jobs)), strict=True)):
        try:
            payload = ensure_payload_fits(item.payload, settings)
            new = plan_create(item, tenant_id, defaults, caller.now)
            check_job_within_limits(limits, new.schedule, new.policy, caller.now)
        except ScheduleError as exc:
            raise ScheduleError(f"jobs[{index}].{exc.field}", exc.message) from None
        except PlanError as exc:
            raise PlanError(f"jobs[{index}].{exc.field}", exc.message) from None
        except Problem as refused:
            if refused.field is not None:
                refused.field = f"jobs[{index}].{refused.field}"
            raise
        batch.append(PreparedJob.of(new, payload, job_id))
    await ensure_room_for_jobs(conn, quotas, tenant_id, new_jobs=len(batch))
    live = await target_lock_live_many(conn, tenant_id, {job.new.target_id for job in batch})
    for index, job in enumerate(batch):
        if job.new.target_id not in live:
            raise Problem(422, "no such target", slug="validation", field=f"jobs[{index}].target_id")
    not_created = await job_create_many_checked(conn, tenant_id, batch)
    items: list[dict[str, Any]] = []
    for index, job in enumerate(batch):
        reason = not_created.get(job.id) if not_created else None  # a UUID's hash is Python code
        if reason is None:
            due = job.new.first_fire_at.isoformat().replace("+00:00", "Z")
            items.append({"index": index, "status": 201, "id": str(job.id), "next_run_at": due, "problem": None})
            continue
        if reason.holder is None:  # the targets are share-locked: they cannot have gone
            raise RuntimeError("a locked target disappeared during a batch create")
        problem = {
            "type": "urn:cronhook:problem:duplicate-job",
            "title": "Conflict",
            "status": 409,
            "detail": f"an unfinished job already has this dedup_key: {reason.holder}",
            "field": f"jobs[{index}].dedup_key",
            "job_id": str(reason.holder),
        }
        items.append({"index": index, "status": 409, "id": None, "next_run_at": None, "problem": problem})
    status = 207 if not_created else 201
    result = {"created": len(batch) - len(not_created), "conflicts": len(not_created), "items": items}
    await idempotent.finish(status, result)
    return JSONResponse(result, status_code=status)
