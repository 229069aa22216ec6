"""/v1/schedule-sets/{set}: a declarative set of named schedules applied in one transaction
(dry run, prune). HTTP only: the plan and its writes are app/api/schedule_sets.py."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel, Field

from app.api.audit import Audited
from app.api.deps import CallerDep, Conn, QuotasDep, SettingsDep
from app.api.schedule_sets import SetItem, apply_set
from app.api.schemas.inputs import RequestModel

router = APIRouter(prefix="/v1/schedule-sets", tags=["schedules"], dependencies=[Audited])

# A set is applied in one transaction; this bounds its size (and the request's body).
MAX_SET_SCHEDULES = 10_000


class ScheduleSetPut(RequestModel):
    schedules: Annotated[list[SetItem], Field(max_length=MAX_SET_SCHEDULES)] = Field(
        description=f"Up to {MAX_SET_SCHEDULES:,} schedules, each a job's body (as PUT /v1/schedules/{{key}}) "
        "with its `key`"
    )
    prune: bool | None = Field(
        default=None, description="Also cancel the set's schedules not listed here (default false)"
    )


class ScheduleSetPlan(BaseModel):
    set: str
    dry_run: bool = Field(description="Nothing was written: the plan a real apply would carry out")
    created: list[str] = Field(description="Keys created")
    changed: dict[str, list[str]] = Field(description="Keys changed, with the fields that changed")
    unchanged: list[str] = Field(description="Keys that matched already (nothing written)")
    pruned: list[str] = Field(description="Keys of the set not listed, cancelled (with prune)")


@router.put("/{set_name}", operation_id="putScheduleSet", response_model=ScheduleSetPlan)
async def put_schedule_set(
    set_name: Annotated[str, Path(min_length=1, max_length=200, description="The set's name, as a key is spelled")],
    body: ScheduleSetPut,
    request: Request,
    caller: CallerDep,
    conn: Conn,
    settings: SettingsDep,
    quotas: QuotasDep,
    dry_run: Annotated[bool, Query(description="Answer the plan without writing anything")] = False,
) -> ScheduleSetPlan:
    """Makes the set's schedules the ones listed, all or nothing: creates, changes and leaves
    alone as PUT /v1/schedules/{key} does for one; with `prune`, cancels the set's others. A
    key of another set is a 409 naming it; a key listed twice a 422 naming both."""
    plan = await apply_set(conn, caller, set_name, body.schedules, bool(body.prune), dry_run, settings, quotas)
    # A dry run changed nothing: no audit row.
    request.state.audited = dry_run
    return ScheduleSetPlan(
        set=plan.set,
        dry_run=plan.dry_run,
        created=plan.created,
        changed=plan.changed,
        unchanged=plan.unchanged,
        pruned=plan.pruned,
    )
