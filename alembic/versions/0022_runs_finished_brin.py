"""Runs by time: a BRIN index on runs.finished_at for the delivery statistics
(app/store/run_stats.py, GET /v1/stats/deliveries).

BRIN, not a B-tree: runs are appended in finished_at order, so a summary per 128 pages finds
the last hour's or day's pages, and a delivery's insert leaves it alone until the pages are
summarised (autosummarize, by autovacuum). It is built by one read of the table, and the
migration's transaction holds off writes to runs for that long; build it first by hand with
CONCURRENTLY on a very large table (IF NOT EXISTS then skips it).

Revision ID: 0022
Revises: 0021
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        "CREATE INDEX IF NOT EXISTS ix_runs_finished_brin ON runs USING brin (finished_at) WITH (autosummarize = on)"
    )


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS ix_runs_finished_brin")
