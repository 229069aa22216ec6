"""Schedule health in the store: the rules of app/domain/health.py written in SQL, for the
statements that need them in the database: the health watch's edges (a job becomes failing,
or recovers, each reported once with its event), the health a job shows (`health`, read with
it, and the jobs list's `?health=` filter) and the gauge of jobs by health.

The watch finds its jobs through ix_jobs_health_watch, the partial index of unfinished jobs
(event deliveries aside) in a failure streak, with a deadline of their own, or alerted: a
healthy job without `expect` is not in it, so a pass costs the jobs that may change, not all
of them. Deadlines that come from defaults (the tenant's or the settings' success_within_s)
reach jobs outside it: only then does a pass also read those jobs (Scope.TENANT_DEADLINES,
Scope.ALL_DEADLINES), a scan of the jobs the default applies to.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Integer,
    Select,
    Text,
    and_,
    bindparam,
    case,
    cast,
    column,
    exists,
    false,
    func,
    literal,
    literal_column,
    not_,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, UUID, insert
from sqlalchemy.sql.elements import ColumnElement

from app.db.async_engine import AsyncConnection
from app.domain.events import EventType
from app.domain.health import ALERT_FAILING, Health, HealthDefaults
from app.domain.schedule import ScheduleKind
from app.domain.states import CLAIMABLE_STATES, TERMINAL_STATES, JobState
from app.store.events import event_job_values, random_partition
from app.store.tables import jobs, state_in, targets, tenant_limits, tenants
from app.store.tables_watch import event_subscriptions

_LIVE = not_(state_in(TERMINAL_STATES))
RECURRING_KINDS = (ScheduleKind.CRON, ScheduleKind.INTERVAL)
_RECURRING = jobs.c.schedule_kind.in_(
    [literal_column(f"'{kind.value}'") for kind in (ScheduleKind.CRON, ScheduleKind.INTERVAL)]
)
_ALERTED = jobs.c.health_alert == literal_column(f"'{ALERT_FAILING}'")
# ix_jobs_health_watch's predicate, spelled as the index spells it so the planner uses it.
WATCHED = and_(
    or_(
        jobs.c.consecutive_failures > literal_column("0"),
        jobs.c.expect_success_within_s.is_not(None),
        jobs.c.health_alert.is_not(None),
    ),
    jobs.c.event_type.is_(None),
    _LIVE,
)


def _seconds(value: Any) -> Any:
    return value * literal_column("interval '1 second'")


# -- What a job shows (app/domain/health.py: shown_health) ---------------------------------


def target_paused_of_job() -> ColumnElement[bool]:
    """The job's target or tenant is paused: two look-ups by key, for a row at a time."""
    tenant_paused = exists().where(tenants.c.id == jobs.c.tenant_id, tenants.c.paused_at.is_not(None))
    target = exists().where(targets.c.id == jobs.c.target_id, targets.c.paused_at.is_not(None))
    return or_(target, tenant_paused)


def _late() -> ColumnElement[bool]:
    # A held occurrence's run_at is 'infinity': never before now().
    grace = func.now() - _seconds(jobs.c.misfire_grace_s)
    return and_(state_in(CLAIMABLE_STATES), jobs.c.run_at < grace, jobs.c.held_run_at.is_(None))


def _word(health: Health) -> Any:
    return literal_column(f"'{health.value}'")


def shown_health(target_paused: ColumnElement[bool]) -> ColumnElement[str]:
    """The job's health as shown: the CASE of app/domain/health.py's shown_health, given
    whether its target or tenant is paused."""
    succeeded = case((jobs.c.last_success_at.is_not(None), _word(Health.HEALTHY)), else_=_word(Health.UNKNOWN))
    return case(
        (
            state_in(TERMINAL_STATES),
            case((or_(_ALERTED, state_in([JobState.DEAD])), _word(Health.FAILING)), else_=succeeded),
        ),
        (
            or_(state_in([JobState.PAUSED]), jobs.c.held_run_at.is_not(None), target_paused),
            _word(Health.PAUSED),
        ),
        (_ALERTED, _word(Health.FAILING)),
        (_late(), _word(Health.LATE)),
        else_=succeeded,
    )


def health_column() -> Any:
    """`health`, for any statement that reads jobs one page at a time (SELECT or RETURNING)."""
    return shown_health(target_paused_of_job()).label("health")


def with_health(stmt: Select[Any], health: Health | None) -> Select[Any]:
    """`stmt` (a read of jobs) with each row's health, and only those showing `health` if given."""
    stmt = stmt.add_columns(health_column())
    if health is not None:
        stmt = stmt.where(shown_health(target_paused_of_job()) == _word(health))
    return stmt


# -- The watch's verdict (app/domain/health.py: is_failing, is_paused) ---------------------


def _failing(limits: Any) -> ColumnElement[bool]:
    """The thresholds' verdict: the job's, else its tenant's (`limits`, tenant_limits
    outer-joined), else the settings' (bound parameters)."""
    most = func.coalesce(
        jobs.c.expect_max_consecutive_failures,
        limits.c.expect_max_consecutive_failures,
        bindparam("default_max_consecutive_failures", type_=Integer),
    )
    within = case(
        (
            _RECURRING,
            func.coalesce(
                jobs.c.expect_success_within_s,
                limits.c.expect_success_within_s,
                cast(bindparam("default_success_within_s", type_=Integer), Integer),
            ),
        ),
        else_=None,
    )
    since = func.greatest(jobs.c.last_success_at, jobs.c.created_at, jobs.c.resumed_at)
    missed_deadline = and_(within.is_not(None), since < func.now() - _seconds(within))
    return func.coalesce(or_(jobs.c.consecutive_failures >= most, missed_deadline), false())


def _not_paused() -> ColumnElement[bool]:
    return and_(not_(state_in([JobState.PAUSED])), jobs.c.held_run_at.is_(None), not_(target_paused_of_job()))


class Scope(enum.Enum):
    """Which jobs an edge statement looks at."""

    # ix_jobs_health_watch's: every job that may be failing by its own record or deadline,
    # and every alerted one (all recoveries are among them).
    WATCHED = "watched"
    # Outside it, recurring jobs with no failure streak and no deadline of their own: a
    # default deadline may still pass for them. The tenants' defaults reach only their own
    # jobs (found by tenant, `tenant_ids`); the settings' reach every job.
    TENANT_DEADLINES = "tenant_deadlines"
    ALL_DEADLINES = "all_deadlines"


def _edges(scope: Scope) -> Any:
    """The jobs of `scope` whose recorded verdict (health_alert) differs from the thresholds'
    (failing_now), paused ones aside, at most `limit`, locked. SKIP LOCKED: a job a claim or
    an outcome holds is looked at again next pass, and two reapers never report one edge."""
    if scope is not Scope.WATCHED:
        return _default_deadline_edges(scope)
    limits = tenant_limits.alias("limits")
    verdict = _failing(limits)
    changed = or_(and_(verdict, jobs.c.health_alert.is_(None)), and_(not_(verdict), _ALERTED))
    return (
        select(jobs.c.id, verdict.label("failing_now"))
        .select_from(jobs.outerjoin(limits, limits.c.tenant_id == jobs.c.tenant_id))
        .where(WATCHED, _not_paused(), changed)
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(of=jobs, skip_locked=True)
        .cte("edges")
    )


def _default_deadline_edges(scope: Scope) -> Any:
    """_edges outside the watch index: recurring jobs with no failure streak, no deadline of
    their own and no alert, past a default deadline. Only failing can start here (one that
    recovers is alerted, so watched), and only by the deadline (no streak), which is the
    tenant's (`tenant_ids`, `withins`: tenants with one) else the settings'. The tenants'
    deadlines come as parameters, joined by hash: no look-up per job."""
    tenant_deadlines = (
        func.unnest(
            bindparam("tenant_ids", type_=ARRAY(UUID(as_uuid=True))), bindparam("withins", type_=ARRAY(Integer))
        )
        .table_valued(column("tenant_id", UUID(as_uuid=True)), column("within", Integer))
        .render_derived(name="tenant_deadlines")
    )
    unwatched = and_(
        _LIVE,
        jobs.c.event_type.is_(None),
        _RECURRING,
        jobs.c.consecutive_failures == literal_column("0"),
        jobs.c.expect_success_within_s.is_(None),
        jobs.c.health_alert.is_(None),
    )
    joined = tenant_deadlines.c.tenant_id == jobs.c.tenant_id
    if scope is Scope.TENANT_DEADLINES:
        source = jobs.join(tenant_deadlines, joined)
        within: Any = tenant_deadlines.c.within
    else:
        source = jobs.outerjoin(tenant_deadlines, joined)
        default = bindparam("default_success_within_s", type_=Integer)
        within = func.coalesce(tenant_deadlines.c.within, default)
    since = func.greatest(jobs.c.last_success_at, jobs.c.created_at, jobs.c.resumed_at)
    return (
        select(jobs.c.id, true().label("failing_now"))
        .select_from(source)
        .where(unwatched, since < func.now() - _seconds(within), _not_paused())
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(of=jobs, skip_locked=True)
        .cte("edges")
    )


def _event_data(marked: Any) -> Any:
    """job.health.failing / job.health.recovered's `data` (the brief's names)."""
    pairs: list[Any] = []
    for name in (
        "id",
        "name",
        "schedule_key",
        "labels",
        "health",
        "consecutive_failures",
        "last_success_at",
        "last_failure_at",
        "last_error",
    ):
        pairs += [literal("job_id" if name == "id" else name, Text), marked.c[name]]
    return func.jsonb_build_object(*pairs)


@functools.cache
def edge_statement(scope: Scope) -> Any:
    """One batch of edges among the jobs of `scope`: each job's new verdict recorded, guarded
    by the old one (so an edge is recorded, and reported, once), and its event written for
    each of its tenant's subscriptions to the type, by the same statement (no round trip per
    edge; the event commits with the verdict). Returns each edge's job and direction."""
    edges = _edges(scope)
    alert = case((edges.c.failing_now, literal(ALERT_FAILING, Text)), else_=None)
    event_type = case(
        (edges.c.failing_now, literal(EventType.JOB_HEALTH_FAILING.value, Text)),
        else_=literal(EventType.JOB_HEALTH_RECOVERED.value, Text),
    )
    marked = (
        update(jobs)
        .where(jobs.c.id == edges.c.id, jobs.c.health_alert.is_distinct_from(alert), _LIVE)
        .values(health_alert=alert)
        .returning(
            jobs.c.id,
            jobs.c.tenant_id,
            jobs.c.name,
            jobs.c.schedule_key,
            jobs.c.labels,
            jobs.c.consecutive_failures,
            jobs.c.last_success_at,
            jobs.c.last_failure_at,
            jobs.c.last_error,
            # What the job shows now (not paused: _edges left those out).
            shown_health(false()).label("health"),
            edges.c.failing_now,
            event_type.label("event_type"),
        )
        .cte("marked")
    )
    planned = (
        select(
            marked.c.tenant_id,
            marked.c.event_type,
            _event_data(marked).label("data"),
            event_subscriptions.c.target_id.label("dest"),
            # One event (and webhook-id) per subscription; a CTE of its own so it is evaluated once.
            func.gen_random_uuid().label("event_id"),
        )
        .join(
            event_subscriptions,
            and_(
                event_subscriptions.c.tenant_id == marked.c.tenant_id,
                marked.c.event_type == event_subscriptions.c.types.any_(),
            ),
        )
        .cte("planned_health_events")
    )
    values = event_job_values(
        event_id=planned.c.event_id,
        event_type=planned.c.event_type,
        tenant_id=planned.c.tenant_id,
        target_id=planned.c.dest,
        partition=random_partition(),
        data=planned.c.data,
    )
    live_target = and_(
        targets.c.id == planned.c.dest, targets.c.tenant_id == planned.c.tenant_id, targets.c.deleted_at.is_(None)
    )
    rows = (
        select(*(value.label(name) for name, value in values.items())).select_from(planned).join(targets, live_target)
    )
    written = insert(jobs).from_select(list(values), rows).cte("health_events_written")
    return select(marked.c.id, marked.c.failing_now).add_cte(written)


# Tenants with a default deadline of their own (tenant_limits: one row per tenant at most).
_TENANTS_WITH_DEADLINES = select(tenant_limits.c.tenant_id, tenant_limits.c.expect_success_within_s).where(
    tenant_limits.c.expect_success_within_s.is_not(None)
)


@dataclass(frozen=True)
class HealthEdges:
    failing: int
    recovered: int
    # Some statement found `limit` edges: there may be more (another batch).
    more: bool


async def health_watch_edges(conn: AsyncConnection, defaults: HealthDefaults, limit: int) -> HealthEdges:
    """One batch of the watch (at most `limit` edges per statement), in the caller's
    transaction: jobs whose verdict changed get it recorded and their events written."""
    params: dict[str, Any] = {
        "default_max_consecutive_failures": defaults.max_consecutive_failures,
        "default_success_within_s": defaults.success_within_s,
        "limit": limit,
    }
    scopes = [Scope.WATCHED]
    tenant_deadlines = (await conn.execute(_TENANTS_WITH_DEADLINES)).all()
    params.update(tenant_ids=[row[0] for row in tenant_deadlines], withins=[row[1] for row in tenant_deadlines])
    if defaults.success_within_s is not None:
        scopes.append(Scope.ALL_DEADLINES)
    elif tenant_deadlines:
        scopes.append(Scope.TENANT_DEADLINES)
    failing = recovered = 0
    more = False
    for scope in scopes:
        rows = (await conn.execute(edge_statement(scope), params)).all()
        failing += sum(1 for row in rows if row.failing_now)
        recovered += sum(1 for row in rows if not row.failing_now)
        more = more or len(rows) >= limit
    return HealthEdges(failing=failing, recovered=recovered, more=more)


# -- The gauge ----------------------------------------------------------------------------


def _gauge_statement() -> Any:
    """Unfinished jobs by health, event deliveries aside: one scan, with targets and tenants
    joined (hash joins: no look-up per job)."""
    paused_tenant = tenants.alias("paused_tenant")
    paused_target = or_(targets.c.paused_at.is_not(None), paused_tenant.c.paused_at.is_not(None))
    health = shown_health(func.coalesce(paused_target, false())).label("health")
    joined = jobs.join(targets, targets.c.id == jobs.c.target_id).join(
        paused_tenant, paused_tenant.c.id == jobs.c.tenant_id
    )
    return (
        select(health, func.count().label("jobs"))
        .select_from(joined)
        .where(_LIVE, jobs.c.event_type.is_(None))
        .group_by(literal_column("1"))
    )


_GAUGE = _gauge_statement()


async def job_count_by_health(conn: AsyncConnection) -> dict[Health, int]:
    """Unfinished jobs (event deliveries aside) by the health they show; every word present."""
    counts = dict.fromkeys(Health, 0)
    for row in await conn.execute(_GAUGE):
        counts[Health(row.health)] = int(row.jobs)
    return counts
