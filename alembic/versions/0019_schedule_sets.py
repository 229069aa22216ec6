"""schedule sets: the declarative set a named schedule belongs to

`PUT /v1/schedule-sets/{set}` applies a whole set of named schedules and, with `prune`,
cancels the set's schedules it no longer lists (app/api/schedule_sets.py). A schedule
belongs to at most one set; the column is nullable: adding it rewrites no table.

Revision ID: 0019
Revises: 0018
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("schedule_set", sa.Text))


def downgrade() -> None:
    op.drop_column("jobs", "schedule_set")
