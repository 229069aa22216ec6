"""Inbound check-ins in the store (app/domain/check_ins.py): checks and their pings, a ping
recorded with the check's new deadlines, overdue checks moved down by the check watch, the
pings trimmed to the newest few, and the check.down / check.up events, each written in the
transaction of the change it reports.

The ping token is kept as its SHA-256 (token_hash) and never read back: reads return
PUBLIC_COLUMNS.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from sqlalchemy import and_, delete, func, or_, select, update
from sqlalchemy.engine import RowMapping

from app.db.async_engine import AsyncConnection
from app.domain.check_ins import CheckSchedule, CheckState, CheckStatus, PingKind, PingOutcome
from app.domain.events import EventType
from app.store.events import event_emit
from app.store.tables_watch import check_pings, checks

PUBLIC_COLUMNS = (
    checks.c.id,
    checks.c.name,
    checks.c.every_s,
    checks.c.cron,
    checks.c.timezone,
    checks.c.grace_s,
    checks.c.status,
    checks.c.last_ping_at,
    checks.c.last_ping_kind,
    checks.c.last_started_at,
    checks.c.next_due_at,
    checks.c.alert_at,
    checks.c.labels,
    checks.c.created_at,
    checks.c.updated_at,
)
PING_COLUMNS = (
    check_pings.c.id,
    check_pings.c.kind,
    check_pings.c.received_at,
    check_pings.c.remote_addr,
    check_pings.c.body,
    check_pings.c.duration_ms,
)
# Only checks pinged this recently are looked at for pings to trim: every ping makes its
# check one of them, so none keeps more than `pings_kept` for longer than the watch's pause.
TRIM_WINDOW = dt.timedelta(hours=1)


def _owned(tenant_id: uuid.UUID, check_id: uuid.UUID) -> Any:
    return and_(checks.c.id == check_id, checks.c.tenant_id == tenant_id)


def schedule_of(row: RowMapping) -> CheckSchedule:
    return CheckSchedule(every_s=row["every_s"], cron=row["cron"], timezone=row["timezone"])


def state_of(row: RowMapping) -> CheckState:
    return CheckState(
        schedule=schedule_of(row),
        grace_s=row["grace_s"],
        status=CheckStatus(row["status"]),
        next_due_at=row["next_due_at"],
        last_started_at=row["last_started_at"],
    )


async def check_create(conn: AsyncConnection, tenant_id: uuid.UUID, values: dict[str, Any]) -> RowMapping:
    """A new check (`values`: its columns, token_hash and first deadlines included)."""
    stmt = checks.insert().values(tenant_id=tenant_id, **values).returning(*PUBLIC_COLUMNS)
    return (await conn.execute(stmt)).mappings().one()


async def check_get(
    conn: AsyncConnection, tenant_id: uuid.UUID, check_id: uuid.UUID, *, lock: bool = False
) -> RowMapping | None:
    """The tenant's check; with `lock`, locked for a change for the rest of the transaction."""
    stmt = select(*PUBLIC_COLUMNS).where(_owned(tenant_id, check_id))
    if lock:
        stmt = stmt.with_for_update()
    return (await conn.execute(stmt)).mappings().one_or_none()


async def check_list(
    conn: AsyncConnection,
    tenant_id: uuid.UUID,
    limit: int,
    after: tuple[dt.datetime, uuid.UUID] | None,
    labels: dict[str, str] | None = None,
    status: CheckStatus | None = None,
) -> list[RowMapping]:
    """Newest first."""
    stmt = select(*PUBLIC_COLUMNS).where(checks.c.tenant_id == tenant_id)
    if labels:
        stmt = stmt.where(checks.c.labels.contains(labels))
    if status is not None:
        stmt = stmt.where(checks.c.status == status.value)
    if after is not None:
        created, ident = after
        stmt = stmt.where(or_(checks.c.created_at < created, and_(checks.c.created_at == created, checks.c.id < ident)))
    stmt = stmt.order_by(checks.c.created_at.desc(), checks.c.id.desc()).limit(limit)
    return list((await conn.execute(stmt)).mappings().all())


async def check_update(
    conn: AsyncConnection, tenant_id: uuid.UUID, check_id: uuid.UUID, changes: dict[str, Any]
) -> RowMapping | None:
    stmt = (
        update(checks)
        .where(_owned(tenant_id, check_id))
        .values(**changes, updated_at=func.now())
        .returning(*PUBLIC_COLUMNS)
    )
    return (await conn.execute(stmt)).mappings().one_or_none()


async def check_delete(conn: AsyncConnection, tenant_id: uuid.UUID, check_id: uuid.UUID) -> bool:
    """Deletes the check and its pings; False when the tenant has no such check."""
    result = await conn.execute(delete(checks).where(_owned(tenant_id, check_id)).returning(checks.c.id))
    return result.first() is not None


async def check_set_token(conn: AsyncConnection, tenant_id: uuid.UUID, check_id: uuid.UUID, token_hash: str) -> bool:
    """A new ping token: the old one stops working at once."""
    stmt = (
        update(checks)
        .where(_owned(tenant_id, check_id))
        .values(token_hash=token_hash, updated_at=func.now())
        .returning(checks.c.id)
    )
    return (await conn.execute(stmt)).first() is not None


async def check_lock_by_token(conn: AsyncConnection, token_hash: str) -> RowMapping | None:
    """The check whose ping token has this SHA-256, locked for its ping, with the
    transaction's now() (`db_now`), the ping's time."""
    stmt = (
        select(*PUBLIC_COLUMNS, checks.c.tenant_id, func.now().label("db_now"))
        .where(checks.c.token_hash == token_hash)
        .with_for_update()
    )
    return (await conn.execute(stmt)).mappings().one_or_none()


async def check_record_ping(
    conn: AsyncConnection,
    check: RowMapping,
    kind: PingKind,
    outcome: PingOutcome,
    *,
    body: str | None,
    remote_addr: str,
) -> RowMapping:
    """The ping and the check's new state (the check locked by check_lock_by_token), and the
    edge it makes reported in the same transaction."""
    stmt = (
        update(checks)
        .where(checks.c.id == check["id"])
        .values(
            status=outcome.status.value,
            last_ping_at=func.now(),
            last_ping_kind=kind.value,
            last_started_at=outcome.last_started_at,
            next_due_at=outcome.deadlines.next_due_at,
            alert_at=outcome.deadlines.alert_at,
            updated_at=func.now(),
        )
        .returning(*PUBLIC_COLUMNS, checks.c.tenant_id)
    )
    updated = (await conn.execute(stmt)).mappings().one()
    await conn.execute(
        check_pings.insert().values(
            check_id=check["id"],
            tenant_id=check["tenant_id"],
            kind=kind.value,
            remote_addr=remote_addr,
            body=body,
            duration_ms=outcome.duration_ms,
        )
    )
    if outcome.event is not None:
        await check_emit(conn, updated, outcome.event)
    return updated


async def check_ping_list(
    conn: AsyncConnection, tenant_id: uuid.UUID, check_id: uuid.UUID, limit: int, before_id: int | None
) -> list[RowMapping]:
    """Newest first."""
    stmt = select(*PING_COLUMNS).where(check_pings.c.check_id == check_id, check_pings.c.tenant_id == tenant_id)
    if before_id is not None:
        stmt = stmt.where(check_pings.c.id < before_id)
    stmt = stmt.order_by(check_pings.c.id.desc()).limit(limit)
    return list((await conn.execute(stmt)).mappings().all())


async def check_mark_overdue_down(conn: AsyncConnection, limit: int) -> list[RowMapping]:
    """Up to `limit` checks whose alert_at passed, moved down (and locked until the
    transaction ends). Guarded by `status <> 'down'`, and checks another watch holds are
    skipped: each check goes down once, however many watches run."""
    not_down = checks.c.status != CheckStatus.DOWN.value
    overdue = (
        select(checks.c.id)
        .where(not_down, checks.c.alert_at.is_not(None), checks.c.alert_at <= func.now())
        .order_by(checks.c.alert_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
        .cte("overdue")
    )
    stmt = (
        update(checks)
        .where(checks.c.id == overdue.c.id, not_down)
        .values(status=CheckStatus.DOWN.value, updated_at=func.now())
        .returning(*PUBLIC_COLUMNS, checks.c.tenant_id)
    )
    return list((await conn.execute(stmt)).mappings().all())


async def check_ping_trim(conn: AsyncConnection, pings_kept: int, limit: int) -> int:
    """Deletes the pings beyond the newest `pings_kept` of up to `limit` checks pinged within
    TRIM_WINDOW; returns how many it deleted."""
    newest_dropped = (
        select(check_pings.c.id)
        .where(check_pings.c.check_id == checks.c.id)
        .order_by(check_pings.c.id.desc())
        .offset(pings_kept)
        .limit(1)
        .scalar_subquery()
    )
    cutoffs = (
        select(checks.c.id.label("check_id"), newest_dropped.label("cutoff"))
        .where(checks.c.last_ping_at >= func.now() - TRIM_WINDOW)
        .subquery("pinged")
    )
    trimmed = (
        select(cutoffs.c.check_id, cutoffs.c.cutoff).where(cutoffs.c.cutoff.is_not(None)).limit(limit).cte("trimmed")
    )
    stmt = delete(check_pings).where(check_pings.c.check_id == trimmed.c.check_id, check_pings.c.id <= trimmed.c.cutoff)
    return (await conn.execute(stmt)).rowcount


async def check_emit(conn: AsyncConnection, check: RowMapping, event_type: EventType) -> int:
    """check.down or check.up about `check` (a row with the tenant and PUBLIC_COLUMNS), to
    the tenant's subscriptions, in the caller's transaction."""
    data = {
        "check_id": str(check["id"]),
        "name": check["name"],
        "status": check["status"],
        "labels": check["labels"],
        "last_ping_at": _instant(check["last_ping_at"]),
        "last_ping_kind": check["last_ping_kind"],
        "next_due_at": _instant(check["next_due_at"]),
        "grace_s": check["grace_s"],
    }
    return await event_emit(conn, check["tenant_id"], event_type, data)


def _instant(value: dt.datetime | None) -> str | None:
    return None if value is None else value.isoformat()
