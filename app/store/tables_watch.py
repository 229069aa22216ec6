"""The schema of watching over schedules (issue: health, events, check-ins): event
subscriptions, inbound checks and their pings. Defined on the one MetaData of
app/store/tables.py; app/store/schema.py gathers both for migrations and their test."""

from __future__ import annotations

from sqlalchemy import BigInteger, CheckConstraint, Column, ForeignKey, Identity, Index, Integer, Table, Text, text
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID

from app.store.tables import _ts, metadata

# A tenant's subscription to event types (app/domain/events.py): each event of those types
# becomes a one-off job to `target_id`, signed, retried and dead-lettered like any delivery.
event_subscriptions = Table(
    "event_subscriptions",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True, server_default=text("gen_random_uuid()")),
    Column("tenant_id", UUID(as_uuid=True), ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False),
    Column("target_id", UUID(as_uuid=True), nullable=False),
    Column("types", ARRAY(Text), nullable=False),
    Column("description", Text),
    _ts("created_at", nullable=False, default_now=True),
    CheckConstraint("cardinality(types) >= 1", name="types_not_empty"),
    Index("ix_event_subscriptions_tenant", "tenant_id", "created_at", "id"),
    Index("ix_event_subscriptions_target", "target_id"),
)

# An inbound check-in (a dead-man's switch for a cron cronhook does not run): expected to be
# pinged every `every_s` (or on `cron` in `timezone`); `down` once a ping is `grace_s` past
# due (`alert_at`), `up` again at the next ping. The ping URL's token is kept as its SHA-256.
checks = Table(
    "checks",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True, server_default=text("gen_random_uuid()")),
    Column("tenant_id", UUID(as_uuid=True), ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False),
    Column("name", Text, nullable=False),
    Column("every_s", Integer),
    Column("cron", Text),
    Column("timezone", Text, nullable=False, server_default=text("'UTC'")),
    Column("grace_s", Integer, nullable=False),
    Column("token_hash", Text, nullable=False, unique=True),
    # new (never pinged), up, down; `started`: a /start ping came and its end has not.
    Column("status", Text, nullable=False, server_default=text("'new'")),
    _ts("last_ping_at"),
    Column("last_ping_kind", Text),
    _ts("last_started_at"),
    # When the next ping is due, and when the check goes down without it (due + grace).
    _ts("next_due_at"),
    _ts("alert_at"),
    Column("labels", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    _ts("created_at", nullable=False, default_now=True),
    _ts("updated_at", nullable=False, default_now=True),
    CheckConstraint("(every_s IS NULL) <> (cron IS NULL)", name="one_schedule"),
    CheckConstraint("every_s IS NULL OR every_s >= 1", name="every_s_positive"),
    CheckConstraint("grace_s >= 0", name="grace_not_negative"),
    CheckConstraint("status IN ('new', 'up', 'down', 'started')", name="status_valid"),
    Index("ix_checks_tenant_created", "tenant_id", "created_at", "id"),
    # The watchdog's overdue checks, earliest first.
    Index("ix_checks_alert", "alert_at", postgresql_where=text("status <> 'down' AND alert_at IS NOT NULL")),
)

# A check's received pings, newest kept (the watchdog's retention trims them).
check_pings = Table(
    "check_pings",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("check_id", UUID(as_uuid=True), ForeignKey("checks.id", ondelete="CASCADE"), nullable=False),
    Column("tenant_id", UUID(as_uuid=True), nullable=False),
    # success, start, fail
    Column("kind", Text, nullable=False),
    _ts("received_at", nullable=False, default_now=True),
    Column("remote_addr", Text),
    # The first bytes of the ping's body (a script's log tail), if any.
    Column("body", Text),
    # A success or fail ping after a start: how long the run took.
    Column("duration_ms", Integer),
    CheckConstraint("kind IN ('success', 'start', 'fail')", name="kind_valid"),
    Index("ix_check_pings_check", "check_id", "id"),
)
