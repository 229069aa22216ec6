"""scheduling semantics: pause, interval modes, misfire and overlap policies, bounds, dedup keys,
per-target limits, idempotency keys

Revision ID: 0004
Revises: 0003
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_OUTCOMES = "outcome IN ('success', 'http_error', 'timeout', 'connection_error', 'lease_expired')"
NEW_OUTCOMES = (
    "outcome IN ('success', 'http_error', 'timeout', 'connection_error', 'lease_expired', 'missed', 'skipped_overlap')"
)
CLAIMABLE = "state IN ('scheduled', 'retrying')"
UNFINISHED = "dedup_key IS NOT NULL AND state NOT IN ('succeeded', 'dead', 'cancelled')"


def upgrade() -> None:
    # PostgreSQL 12+ accepts this inside the migration's transaction (the value is not used here).
    op.execute("ALTER TYPE job_state ADD VALUE IF NOT EXISTS 'paused' AFTER 'retrying'")
    text_default = {"nullable": False}
    op.add_column("jobs", sa.Column("interval_mode", sa.Text(), server_default=sa.text("'fixed_rate'"), **text_default))
    op.add_column("jobs", sa.Column("misfire_policy", sa.Text(), server_default=sa.text("'fire_once'"), **text_default))
    op.add_column("jobs", sa.Column("misfire_grace_s", sa.Double(), server_default=sa.text("60"), nullable=False))
    op.add_column("jobs", sa.Column("catch_up_limit", sa.Integer(), server_default=sa.text("10"), nullable=False))
    op.add_column("jobs", sa.Column("overlap_policy", sa.Text(), server_default=sa.text("'forbid'"), **text_default))
    op.add_column("jobs", sa.Column("start_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("jobs", sa.Column("end_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("jobs", sa.Column("max_runs", sa.Integer(), nullable=True))
    op.add_column("jobs", sa.Column("ended_reason", sa.Text(), nullable=True))
    op.add_column("jobs", sa.Column("dedup_key", sa.Text(), nullable=True))
    for name, condition in (
        ("interval_mode_valid", "interval_mode IN ('fixed_rate', 'fixed_delay')"),
        ("misfire_policy_valid", "misfire_policy IN ('skip', 'fire_once', 'catch_up')"),
        ("overlap_policy_valid", "overlap_policy IN ('allow', 'forbid')"),
        ("misfire_bounds", "misfire_grace_s >= 0 AND catch_up_limit >= 1"),
        ("max_runs_positive", "max_runs IS NULL OR max_runs >= 1"),
    ):
        op.create_check_constraint(op.f(f"ck_jobs_{name}"), "jobs", condition)
    # The claim scans each priority level in run_at order (priority with aging).
    op.drop_index("ix_jobs_due", table_name="jobs", postgresql_where=sa.text(CLAIMABLE))
    op.create_index("ix_jobs_due", "jobs", ["priority", "run_at"], postgresql_where=sa.text(CLAIMABLE))
    op.create_index("ix_jobs_target_running", "jobs", ["target_id"], postgresql_where=sa.text("state = 'running'"))
    op.create_index(
        "ix_jobs_tenant_dedup_key",
        "jobs",
        ["tenant_id", "dedup_key"],
        unique=True,
        postgresql_where=sa.text(UNFINISHED),
    )

    op.add_column("targets", sa.Column("max_in_flight", sa.Integer(), nullable=True))
    op.add_column("targets", sa.Column("rate_per_s", sa.Double(), nullable=True))
    op.add_column("targets", sa.Column("rate_tokens", sa.Double(), nullable=True))
    op.add_column("targets", sa.Column("rate_updated_at", sa.DateTime(timezone=True), nullable=True))
    op.create_check_constraint(
        op.f("ck_targets_max_in_flight_positive"), "targets", "max_in_flight IS NULL OR max_in_flight >= 1"
    )
    op.create_check_constraint(op.f("ck_targets_rate_positive"), "targets", "rate_per_s IS NULL OR rate_per_s > 0")

    op.drop_constraint(op.f("ck_runs_outcome_valid"), "runs", type_="check")
    op.create_check_constraint(op.f("ck_runs_outcome_valid"), "runs", NEW_OUTCOMES)

    op.create_table(
        "idempotency_keys",
        sa.Column("tenant_id", sa.UUID(), nullable=False),
        sa.Column("endpoint", sa.Text(), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("request_hash", sa.Text(), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("response", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_idempotency_keys_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("tenant_id", "endpoint", "key", name=op.f("pk_idempotency_keys")),
    )
    op.create_index("ix_idempotency_keys_created", "idempotency_keys", ["created_at"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_idempotency_keys_created", table_name="idempotency_keys")
    op.drop_table("idempotency_keys")
    op.execute("DELETE FROM runs WHERE outcome IN ('missed', 'skipped_overlap')")
    op.drop_constraint(op.f("ck_runs_outcome_valid"), "runs", type_="check")
    op.create_check_constraint(op.f("ck_runs_outcome_valid"), "runs", OLD_OUTCOMES)
    op.drop_constraint(op.f("ck_targets_rate_positive"), "targets", type_="check")
    op.drop_constraint(op.f("ck_targets_max_in_flight_positive"), "targets", type_="check")
    for column in ("rate_updated_at", "rate_tokens", "rate_per_s", "max_in_flight"):
        op.drop_column("targets", column)
    op.drop_index("ix_jobs_tenant_dedup_key", table_name="jobs", postgresql_where=sa.text(UNFINISHED))
    op.drop_index("ix_jobs_target_running", table_name="jobs", postgresql_where=sa.text("state = 'running'"))
    op.drop_index("ix_jobs_due", table_name="jobs", postgresql_where=sa.text(CLAIMABLE))
    op.create_index("ix_jobs_due", "jobs", ["run_at"], postgresql_where=sa.text(CLAIMABLE))
    for name in ("max_runs_positive", "misfire_bounds", "overlap_policy_valid", "misfire_policy_valid"):
        op.drop_constraint(op.f(f"ck_jobs_{name}"), "jobs", type_="check")
    op.drop_constraint(op.f("ck_jobs_interval_mode_valid"), "jobs", type_="check")
    for column in (
        "dedup_key",
        "ended_reason",
        "max_runs",
        "end_at",
        "start_at",
        "overlap_policy",
        "catch_up_limit",
        "misfire_grace_s",
        "misfire_policy",
        "interval_mode",
    ):
        op.drop_column("jobs", column)
    # Paused jobs resume as scheduled; the enum value itself stays (PostgreSQL cannot drop one).
    op.execute("UPDATE jobs SET state = 'scheduled', run_at = coalesce(run_at, now()) WHERE state = 'paused'")
