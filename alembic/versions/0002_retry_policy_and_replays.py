"""retry policy factor, per-target retryable statuses, dead-letter replays

Revision ID: 0002
Revises: 0001
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("targets", sa.Column("retry_on_status", postgresql.ARRAY(sa.SmallInteger()), nullable=True))
    op.add_column("jobs", sa.Column("backoff_factor", sa.Double(), server_default=sa.text("2"), nullable=False))
    op.create_check_constraint(op.f("ck_jobs_backoff_factor_at_least_one"), "jobs", "backoff_factor >= 1")
    op.add_column("dead_letters", sa.Column("replayed_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("dead_letters", sa.Column("replay_job_id", sa.UUID(), nullable=True))


def downgrade() -> None:
    op.drop_column("dead_letters", "replay_job_id")
    op.drop_column("dead_letters", "replayed_at")
    op.drop_constraint(op.f("ck_jobs_backoff_factor_at_least_one"), "jobs", type_="check")
    op.drop_column("jobs", "backoff_factor")
    op.drop_column("targets", "retry_on_status")
