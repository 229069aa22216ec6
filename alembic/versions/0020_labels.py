"""labels: key/value pairs on jobs and targets to find them by (`?label=team=payments`)

A constant default: adding the columns rewrites no table.

Revision ID: 0020
Revises: 0019
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    for table in ("jobs", "targets"):
        op.add_column(table, sa.Column("labels", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")))


def downgrade() -> None:
    for table in ("jobs", "targets"):
        op.drop_column(table, "labels")
