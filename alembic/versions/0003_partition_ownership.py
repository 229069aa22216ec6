"""partition ownership: replicas and partition leases

Revision ID: 0003
Revises: 0002
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Fixed here once and for all (app/domain/partition.py): jobs' partitions hash into it.
PARTITION_COUNT = 256


def upgrade() -> None:
    op.create_table(
        "replicas",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_replicas")),
    )
    op.create_table(
        "partition_leases",
        sa.Column("partition", sa.SmallInteger(), autoincrement=False, nullable=False),
        sa.Column("owner", sa.Text(), nullable=True),
        sa.Column("epoch", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("acquired_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            f"partition >= 0 AND partition < {PARTITION_COUNT}", name=op.f("ck_partition_leases_partition_range")
        ),
        sa.CheckConstraint("(owner IS NULL) = (expires_at IS NULL)", name=op.f("ck_partition_leases_owner_iff_expiry")),
        sa.PrimaryKeyConstraint("partition", name=op.f("pk_partition_leases")),
    )
    op.execute(f"INSERT INTO partition_leases (partition) SELECT generate_series(0, {PARTITION_COUNT - 1})")
    op.create_index(
        "ix_jobs_partition_due",
        "jobs",
        ["partition", "run_at"],
        unique=False,
        postgresql_where=sa.text("state IN ('scheduled', 'retrying')"),
    )


def downgrade() -> None:
    op.drop_index(
        "ix_jobs_partition_due", table_name="jobs", postgresql_where=sa.text("state IN ('scheduled', 'retrying')")
    )
    op.drop_table("partition_leases")
    op.drop_table("replicas")
