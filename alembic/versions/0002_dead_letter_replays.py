"""dead letters remember their latest replay

Revision ID: 0002
Revises: 0001
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("dead_letters", sa.Column("replayed_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("dead_letters", sa.Column("replay_job_id", sa.UUID(), nullable=True))


def downgrade() -> None:
    op.drop_column("dead_letters", "replay_job_id")
    op.drop_column("dead_letters", "replayed_at")
