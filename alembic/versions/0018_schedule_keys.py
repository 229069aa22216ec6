"""named schedules: a key per tenant among unfinished jobs

`PUT /v1/schedules/{key}` creates or replaces the job known by `key` (app/api/
schedule_upserts.py). The key is unique among the tenant's unfinished jobs only, so a
cancelled or finished job frees it at once; existing jobs have none. The column is nullable
and the index partial: adding them rewrites no table.

Revision ID: 0018
Revises: 0017
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("schedule_key", sa.Text))
    op.create_index(
        "ix_jobs_schedule_key",
        "jobs",
        ["tenant_id", "schedule_key"],
        unique=True,
        postgresql_where=sa.text("schedule_key IS NOT NULL AND state NOT IN ('succeeded', 'dead', 'cancelled')"),
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_schedule_key", "jobs")
    op.drop_column("jobs", "schedule_key")
