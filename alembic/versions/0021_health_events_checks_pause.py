"""health, events, checks and pausing: schedule health kept per job, event subscriptions,
inbound check-ins with their pings, target and tenant pause with held occurrences, and
target auto-pause.

Every added column is NULL or has a constant default: no table is rewritten.

Revision ID: 0021
Revises: 0020
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TS = sa.DateTime(timezone=True)
_LIVE = "state NOT IN ('succeeded', 'dead', 'cancelled')"


def upgrade() -> None:
    for name in ("paused_at", "paused_until"):
        op.add_column("tenants", sa.Column(name, _TS))
    op.add_column("tenants", sa.Column("paused_reason", sa.Text))
    for name in ("expect_success_within_s", "expect_max_consecutive_failures"):
        op.add_column("tenant_limits", sa.Column(name, sa.Integer))

    for name in ("paused_at", "paused_until"):
        op.add_column("targets", sa.Column(name, _TS))
    op.add_column("targets", sa.Column("paused_reason", sa.Text))
    op.add_column("targets", sa.Column("pause_kind", sa.Text))
    op.add_column("targets", sa.Column("auto_pause_failures", sa.Integer))
    op.add_column("targets", sa.Column("consecutive_failures", sa.Integer, nullable=False, server_default=sa.text("0")))
    op.create_check_constraint(
        op.f("ck_targets_pause_kind_valid"),
        "targets",
        "(paused_at IS NULL) = (pause_kind IS NULL) AND (pause_kind IS NULL OR pause_kind IN ('manual', 'auto'))",
    )
    op.create_check_constraint(
        op.f("ck_targets_auto_pause_positive"), "targets", "auto_pause_failures IS NULL OR auto_pause_failures >= 1"
    )

    for name in ("last_success_at", "last_failure_at"):
        op.add_column("jobs", sa.Column(name, _TS))
    op.add_column("jobs", sa.Column("consecutive_failures", sa.Integer, nullable=False, server_default=sa.text("0")))
    for name in ("expect_success_within_s", "expect_max_consecutive_failures"):
        op.add_column("jobs", sa.Column(name, sa.Integer))
    op.add_column("jobs", sa.Column("health_alert", sa.Text))
    for name in ("on_success_target_id", "on_failure_target_id"):
        op.add_column("jobs", sa.Column(name, UUID(as_uuid=True)))
    op.add_column("jobs", sa.Column("event_type", sa.Text))
    op.add_column("jobs", sa.Column("held_run_at", _TS))
    op.add_column("jobs", sa.Column("resumed_at", _TS))
    op.create_check_constraint(
        op.f("ck_jobs_health_alert_valid"), "jobs", "health_alert IS NULL OR health_alert = 'failing'"
    )
    op.create_check_constraint(
        op.f("ck_jobs_expect_positive"),
        "jobs",
        "(expect_success_within_s IS NULL OR expect_success_within_s >= 1) AND "
        "(expect_max_consecutive_failures IS NULL OR expect_max_consecutive_failures >= 1)",
    )
    # New columns hold NULL / 0 everywhere: both indexes start empty.
    op.create_index(
        "ix_jobs_health_watch",
        "jobs",
        ["id"],
        postgresql_where=sa.text(
            "(consecutive_failures > 0 OR expect_success_within_s IS NOT NULL OR health_alert IS NOT NULL) "
            f"AND event_type IS NULL AND {_LIVE}"
        ),
    )
    op.create_index(
        "ix_jobs_held", "jobs", ["target_id", "held_run_at"], postgresql_where=sa.text("held_run_at IS NOT NULL")
    )

    op.create_table(
        "event_subscriptions",
        sa.Column("id", UUID(as_uuid=True), primary_key=True, server_default=sa.text("gen_random_uuid()")),
        sa.Column("tenant_id", UUID(as_uuid=True), sa.ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False),
        sa.Column("target_id", UUID(as_uuid=True), nullable=False),
        sa.Column("types", ARRAY(sa.Text), nullable=False),
        sa.Column("description", sa.Text),
        sa.Column("created_at", _TS, nullable=False, server_default=sa.text("now()")),
        sa.CheckConstraint("cardinality(types) >= 1", name=op.f("ck_event_subscriptions_types_not_empty")),
    )
    op.create_index("ix_event_subscriptions_tenant", "event_subscriptions", ["tenant_id", "created_at", "id"])
    op.create_index("ix_event_subscriptions_target", "event_subscriptions", ["target_id"])

    op.create_table(
        "checks",
        sa.Column("id", UUID(as_uuid=True), primary_key=True, server_default=sa.text("gen_random_uuid()")),
        sa.Column("tenant_id", UUID(as_uuid=True), sa.ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("every_s", sa.Integer),
        sa.Column("cron", sa.Text),
        sa.Column("timezone", sa.Text, nullable=False, server_default=sa.text("'UTC'")),
        sa.Column("grace_s", sa.Integer, nullable=False),
        sa.Column("token_hash", sa.Text, nullable=False, unique=True),
        sa.Column("status", sa.Text, nullable=False, server_default=sa.text("'new'")),
        sa.Column("last_ping_at", _TS),
        sa.Column("last_ping_kind", sa.Text),
        sa.Column("last_started_at", _TS),
        sa.Column("next_due_at", _TS),
        sa.Column("alert_at", _TS),
        sa.Column("labels", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("created_at", _TS, nullable=False, server_default=sa.text("now()")),
        sa.Column("updated_at", _TS, nullable=False, server_default=sa.text("now()")),
        sa.CheckConstraint("(every_s IS NULL) <> (cron IS NULL)", name=op.f("ck_checks_one_schedule")),
        sa.CheckConstraint("every_s IS NULL OR every_s >= 1", name=op.f("ck_checks_every_s_positive")),
        sa.CheckConstraint("grace_s >= 0", name=op.f("ck_checks_grace_not_negative")),
        sa.CheckConstraint("status IN ('new', 'up', 'down', 'started')", name=op.f("ck_checks_status_valid")),
    )
    op.create_index("ix_checks_tenant_created", "checks", ["tenant_id", "created_at", "id"])
    op.create_index(
        "ix_checks_alert", "checks", ["alert_at"], postgresql_where=sa.text("status <> 'down' AND alert_at IS NOT NULL")
    )
    op.create_table(
        "check_pings",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("check_id", UUID(as_uuid=True), sa.ForeignKey("checks.id", ondelete="CASCADE"), nullable=False),
        sa.Column("tenant_id", UUID(as_uuid=True), nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("received_at", _TS, nullable=False, server_default=sa.text("now()")),
        sa.Column("remote_addr", sa.Text),
        sa.Column("body", sa.Text),
        sa.Column("duration_ms", sa.Integer),
        sa.CheckConstraint("kind IN ('success', 'start', 'fail')", name=op.f("ck_check_pings_kind_valid")),
    )
    op.create_index("ix_check_pings_check", "check_pings", ["check_id", "id"])


def downgrade() -> None:
    op.drop_table("check_pings")
    op.drop_table("checks")
    op.drop_table("event_subscriptions")
    op.drop_index("ix_jobs_held", table_name="jobs")
    op.drop_index("ix_jobs_health_watch", table_name="jobs")
    op.drop_constraint(op.f("ck_jobs_expect_positive"), "jobs", type_="check")
    op.drop_constraint(op.f("ck_jobs_health_alert_valid"), "jobs", type_="check")
    for name in (
        "resumed_at",
        "held_run_at",
        "event_type",
        "on_failure_target_id",
        "on_success_target_id",
        "health_alert",
        "expect_max_consecutive_failures",
        "expect_success_within_s",
        "consecutive_failures",
        "last_failure_at",
        "last_success_at",
    ):
        op.drop_column("jobs", name)
    op.drop_constraint(op.f("ck_targets_auto_pause_positive"), "targets", type_="check")
    op.drop_constraint(op.f("ck_targets_pause_kind_valid"), "targets", type_="check")
    for name in (
        "consecutive_failures",
        "auto_pause_failures",
        "pause_kind",
        "paused_reason",
        "paused_until",
        "paused_at",
    ):
        op.drop_column("targets", name)
    for name in ("expect_max_consecutive_failures", "expect_success_within_s"):
        op.drop_column("tenant_limits", name)
    for name in ("paused_reason", "paused_until", "paused_at"):
        op.drop_column("tenants", name)
