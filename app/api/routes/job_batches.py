"""POST /v1/jobs/batch: many creates in one transaction and (nearly) one INSERT (HTTP only:
the create itself is app/api/job_creates.py, create_batch).

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
from app.api.deps import CallerDep, Conn, QuotasDep, SettingsDep
from app.api.idempotency import REPLAYED_HEADER, REPLAYED_RESPONSE_DOC, IdempotencyKey, IdempotentRequest
from app.api.job_creates import create_batch
from app.api.schemas.job_batches import JobBatchCreate, JobBatchResult

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
    caller: CallerDep,
    conn: Conn,
    settings: SettingsDep,
    quotas: QuotasDep,
    idempotency_key: IdempotencyKey = None,
) -> Any:
    idempotent = IdempotentRequest(conn, caller.tenant_id, ENDPOINT, idempotency_key, body)
    if (replay := await idempotent.begin()) is not None:
        return JSONResponse(replay.body, status_code=replay.status_code, headers={REPLAYED_HEADER: "true"})
    created = await create_batch(conn, caller, body.jobs, settings, quotas)
    await idempotent.finish(created.status, created.body)
    return JSONResponse(created.body, status_code=created.status)
