"""jobs.occurrence_claimed_at: when the current occurrence's first attempt was claimed

A retried occurrence must still know which fire times were a backlog when it was first
claimed (the misfire policy delivers those) and which came due while it was in flight (the
overlap policy's).

Revision ID: 0005
Revises: 0004
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable without a default: a metadata-only change, no table rewrite.
    op.add_column("jobs", sa.Column("occurrence_claimed_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "occurrence_claimed_at")
