"""jobs.parent_job_id: the recurring job a one-off carries an occurrence of

A triggered occurrence, and under overlap_policy allow every occurrence, is delivered by a
one-off child job so that deliveries of one schedule can overlap; the parent's runs list
includes its children's.

Revision ID: 0006
Revises: 0005
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("parent_job_id", postgresql.UUID(as_uuid=True), nullable=True))
    op.create_foreign_key("fk_jobs_parent_job_id_jobs", "jobs", "jobs", ["parent_job_id"], ["id"], ondelete="SET NULL")
    op.create_index("ix_jobs_parent", "jobs", ["parent_job_id"], postgresql_where=sa.text("parent_job_id IS NOT NULL"))


def downgrade() -> None:
    op.drop_index("ix_jobs_parent", table_name="jobs")
    op.drop_constraint("fk_jobs_parent_job_id_jobs", "jobs", type_="foreignkey")
    op.drop_column("jobs", "parent_job_id")
