"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-22 04:18:34.329162
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "tenants",
        sa.Column("id", sa.UUID(), server_default=sa.text("gen_random_uuid()"), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tenants")),
        sa.UniqueConstraint("name", name=op.f("uq_tenants_name")),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.UUID(), server_default=sa.text("gen_random_uuid()"), nullable=False),
        sa.Column("tenant_id", sa.UUID(), nullable=False),
        sa.Column("key_hash", sa.Text(), nullable=False),
        sa.Column("key_prefix", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_api_keys_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("key_hash", name=op.f("uq_api_keys_key_hash")),
    )
    op.create_table(
        "targets",
        sa.Column("id", sa.UUID(), server_default=sa.text("gen_random_uuid()"), nullable=False),
        sa.Column("tenant_id", sa.UUID(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column(
            "headers",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column("timeout_s", sa.Double(), nullable=False),
        sa.Column("signing_secret", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("timeout_s > 0", name=op.f("ck_targets_timeout_positive")),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_targets_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_targets")),
    )
    op.create_index("ix_targets_tenant_created", "targets", ["tenant_id", "created_at", "id"], unique=False)
    op.create_table(
        "jobs",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("tenant_id", sa.UUID(), nullable=False),
        sa.Column("target_id", sa.UUID(), nullable=False),
        sa.Column("partition", sa.SmallInteger(), nullable=False),
        sa.Column("name", sa.Text(), nullable=True),
        sa.Column("payload", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("priority", sa.SmallInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column(
            "state",
            sa.Enum("scheduled", "running", "retrying", "succeeded", "dead", "cancelled", name="job_state"),
            nullable=False,
        ),
        sa.Column("schedule_kind", sa.Text(), nullable=False),
        sa.Column("cron", sa.Text(), nullable=True),
        sa.Column("timezone", sa.Text(), server_default=sa.text("'UTC'"), nullable=False),
        sa.Column("every_s", sa.Integer(), nullable=True),
        sa.Column("schedule_anchor_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("scheduled_for", sa.DateTime(timezone=True), nullable=False),
        sa.Column("occurrence_id", sa.UUID(), nullable=False),
        sa.Column("run_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("attempt", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("backoff_base_s", sa.Double(), nullable=False),
        sa.Column("backoff_max_s", sa.Double(), nullable=False),
        sa.Column("lease_owner", sa.Text(), nullable=True),
        sa.Column("lease_token", sa.UUID(), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_status_code", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("occurrences_run", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "(schedule_kind = 'cron') = (cron IS NOT NULL) AND (schedule_kind = 'interval') = (every_s IS NOT NULL)",
            name=op.f("ck_jobs_schedule_fields_match_kind"),
        ),
        sa.CheckConstraint(
            "(state = 'running') = (lease_token IS NOT NULL AND lease_expires_at IS NOT NULL"
            " AND lease_owner IS NOT NULL)",
            name=op.f("ck_jobs_running_iff_leased"),
        ),
        sa.CheckConstraint(
            "(state IN ('scheduled', 'retrying')) = (run_at IS NOT NULL)",
            name=op.f("ck_jobs_waiting_iff_run_at"),
        ),
        sa.CheckConstraint("schedule_kind IN ('once', 'cron', 'interval')", name=op.f("ck_jobs_schedule_kind_valid")),
        sa.CheckConstraint("attempt >= 0 AND attempt <= max_attempts", name=op.f("ck_jobs_attempt_within_max")),
        sa.CheckConstraint("every_s IS NULL OR every_s > 0", name=op.f("ck_jobs_every_s_positive")),
        sa.CheckConstraint("max_attempts >= 1", name=op.f("ck_jobs_max_attempts_positive")),
        sa.CheckConstraint("partition >= 0 AND partition < 256", name=op.f("ck_jobs_partition_range")),
        sa.CheckConstraint("priority BETWEEN 0 AND 9", name=op.f("ck_jobs_priority_range")),
        sa.ForeignKeyConstraint(["target_id"], ["targets.id"], name=op.f("fk_jobs_target_id_targets")),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_jobs_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
    )
    op.create_index(
        "ix_jobs_due",
        "jobs",
        ["run_at"],
        unique=False,
        postgresql_where=sa.text("state IN ('scheduled', 'retrying')"),
    )
    op.create_index(
        "ix_jobs_lease_expires",
        "jobs",
        ["lease_expires_at"],
        unique=False,
        postgresql_where=sa.text("state = 'running'"),
    )
    op.create_index("ix_jobs_target", "jobs", ["target_id"], unique=False)
    op.create_index("ix_jobs_tenant_created", "jobs", ["tenant_id", "created_at", "id"], unique=False)
    op.create_table(
        "dead_letters",
        sa.Column("id", sa.UUID(), server_default=sa.text("gen_random_uuid()"), nullable=False),
        sa.Column("tenant_id", sa.UUID(), nullable=False),
        sa.Column("job_id", sa.UUID(), nullable=False),
        sa.Column("target_id", sa.UUID(), nullable=False),
        sa.Column("occurrence_id", sa.UUID(), nullable=False),
        sa.Column("scheduled_for", sa.DateTime(timezone=True), nullable=False),
        sa.Column("payload", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("last_status_code", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_dead_letters_job_id_jobs"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_dead_letters_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_dead_letters")),
        sa.UniqueConstraint("occurrence_id", name=op.f("uq_dead_letters_occurrence_id")),
    )
    op.create_index("ix_dead_letters_tenant_created", "dead_letters", ["tenant_id", "created_at", "id"], unique=False)
    op.create_table(
        "runs",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("job_id", sa.UUID(), nullable=False),
        sa.Column("tenant_id", sa.UUID(), nullable=False),
        sa.Column("occurrence_id", sa.UUID(), nullable=False),
        sa.Column("scheduled_for", sa.DateTime(timezone=True), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("replica_id", sa.Text(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("duration_ms", sa.Integer(), nullable=True),
        sa.Column("outcome", sa.Text(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.CheckConstraint(
            "outcome IN ('success', 'http_error', 'timeout', 'connection_error', 'lease_expired')",
            name=op.f("ck_runs_outcome_valid"),
        ),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_runs_job_id_jobs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runs")),
    )
    op.create_index("ix_runs_job", "runs", ["job_id", "id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_runs_job", table_name="runs")
    op.drop_table("runs")
    op.drop_index("ix_dead_letters_tenant_created", table_name="dead_letters")
    op.drop_table("dead_letters")
    op.drop_index("ix_jobs_tenant_created", table_name="jobs")
    op.drop_index("ix_jobs_target", table_name="jobs")
    op.drop_index("ix_jobs_lease_expires", table_name="jobs", postgresql_where=sa.text("state = 'running'"))
    op.drop_index("ix_jobs_due", table_name="jobs", postgresql_where=sa.text("state IN ('scheduled', 'retrying')"))
    op.drop_table("jobs")
    op.drop_index("ix_targets_tenant_created", table_name="targets")
    op.drop_table("targets")
    op.drop_table("api_keys")
    op.drop_table("tenants")
    sa.Enum(name="job_state").drop(op.get_bind(), checkfirst=True)
