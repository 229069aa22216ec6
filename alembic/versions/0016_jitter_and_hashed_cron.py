"""spread in time: hashed cron values (`H`) and per-occurrence jitter

A cron job written with `H` keeps the expression as written in `cron_source` and the
resolved one in `cron` (app/domain/cron_hash.py), so every fire-time computation reads
`cron` as before. `jitter_s` delays each occurrence of a recurring job by up to that many
seconds past its nominal time (`scheduled_for`; `run_at` is the jittered time); a run keeps
the time its occurrence was set to fire (`fire_at`, NULL when that was the nominal time).

Every new column is nullable or has a constant default: adding them rewrites no table.

Revision ID: 0016
Revises: 0015
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("cron_source", sa.Text))
    op.add_column("jobs", sa.Column("jitter_s", sa.Integer, nullable=False, server_default=sa.text("0")))
    op.create_check_constraint("jitter_range", "jobs", "jitter_s BETWEEN 0 AND 3600")
    op.add_column("runs", sa.Column("fire_at", sa.DateTime(timezone=True)))


def downgrade() -> None:
    op.drop_column("runs", "fire_at")
    op.drop_constraint("jitter_range", "jobs", type_="check")
    op.drop_column("jobs", "jitter_s")
    op.drop_column("jobs", "cron_source")
