"""Security: previous signing secrets, API key kinds and names, tenant quotas, the API rate
buckets and the append-only audit log

Existing signing secrets and header values are sealed by start-up right after this
migration (app/runtime.py): sealing needs the key ring, which migrations do not hold.

Revision ID: 0008
Revises: 0006
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0008"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TS = sa.DateTime(timezone=True)
_UUID = postgresql.UUID(as_uuid=True)


def upgrade() -> None:
    op.add_column("targets", sa.Column("previous_signing_secret", sa.Text(), nullable=True))
    op.add_column("targets", sa.Column("previous_secret_expires_at", _TS, nullable=True))
    op.add_column("api_keys", sa.Column("name", sa.Text(), nullable=True))
    op.add_column("api_keys", sa.Column("kind", sa.Text(), nullable=False, server_default=sa.text("'tenant'")))
    op.create_check_constraint("ck_api_keys_kind_valid", "api_keys", "kind IN ('tenant', 'bootstrap')")
    op.create_table(
        "tenant_limits",
        sa.Column("tenant_id", _UUID, nullable=False),
        sa.Column("requests_per_s", sa.Double(), nullable=True),
        sa.Column("max_active_jobs", sa.Integer(), nullable=True),
        sa.Column("max_targets", sa.Integer(), nullable=True),
        sa.Column("min_interval_s", sa.Integer(), nullable=True),
        sa.Column("min_backoff_base_s", sa.Double(), nullable=True),
        sa.Column("max_attempts", sa.Integer(), nullable=True),
        sa.Column("updated_at", _TS, server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name="fk_tenant_limits_tenant_id_tenants", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("tenant_id", name="pk_tenant_limits"),
    )
    op.create_table(
        "api_rate_buckets",
        sa.Column("tenant_id", _UUID, nullable=False),
        sa.Column("tokens", sa.Double(), nullable=False),
        sa.Column("granted", sa.Double(), nullable=False),
        sa.Column("updated_at", _TS, server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name="fk_api_rate_buckets_tenant_id_tenants", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("tenant_id", name="pk_api_rate_buckets"),
    )
    op.create_table(
        "audit_log",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("tenant_id", _UUID, nullable=False),
        sa.Column("api_key_id", _UUID, nullable=True),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("action", sa.Text(), nullable=False),
        sa.Column("object_id", sa.Text(), nullable=True),
        sa.Column("request_id", sa.Text(), nullable=True),
        sa.Column("created_at", _TS, server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_audit_log"),
    )
    op.create_index("ix_audit_log_tenant_id", "audit_log", ["tenant_id", "id"])
    op.create_index(
        "ix_jobs_tenant_active",
        "jobs",
        ["tenant_id"],
        postgresql_where=sa.text("state NOT IN ('succeeded', 'dead', 'cancelled')"),
    )
    # Append-only: history cannot be rewritten through the application's role.
    op.execute(
        """
        CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'audit_log is append-only';
        END $$
        """
    )
    op.execute(
        "CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log "
        "FOR EACH ROW EXECUTE FUNCTION audit_log_append_only()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER audit_log_append_only ON audit_log")
    op.execute("DROP FUNCTION audit_log_append_only()")
    op.drop_index("ix_jobs_tenant_active", table_name="jobs")
    op.drop_index("ix_audit_log_tenant_id", table_name="audit_log")
    op.drop_table("audit_log")
    op.drop_table("api_rate_buckets")
    op.drop_table("tenant_limits")
    op.drop_constraint("ck_api_keys_kind_valid", "api_keys")
    op.drop_column("api_keys", "kind")
    op.drop_column("api_keys", "name")
    op.drop_column("targets", "previous_secret_expires_at")
    op.drop_column("targets", "previous_signing_secret")
