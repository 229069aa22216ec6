"""Retention: indexes that find old history cheaply (app/store/retention.py)

Finished jobs by finished_at (partial: terminal states only), dead letters by job (a
finished job with a dead letter is kept) and by age. (Migrations run in one transaction, so
not CONCURRENTLY: on a very large jobs table, build ix_jobs_finished CONCURRENTLY by hand
first; IF NOT EXISTS then skips it.)

Revision ID: 0010
Revises: 0008
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0010"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        "CREATE INDEX IF NOT EXISTS ix_jobs_finished ON jobs (finished_at) "
        "WHERE state IN ('succeeded', 'dead', 'cancelled')"
    )
    op.execute("CREATE INDEX IF NOT EXISTS ix_dead_letters_job ON dead_letters (job_id)")
    op.execute("CREATE INDEX IF NOT EXISTS ix_dead_letters_created ON dead_letters (created_at)")


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS ix_dead_letters_created")
    op.execute("DROP INDEX IF EXISTS ix_dead_letters_job")
    op.execute("DROP INDEX IF EXISTS ix_jobs_finished")
