"""jobs: fewer indexes on the delivery path; runs: no foreign key to jobs

Every claim and every outcome writes a new version of the job's row, and so a new entry into
each index whose predicate the row meets (a state change is never a HOT update). Measured
on a serial claim/outcome loop (bench/log/2026-11-26-one-statement-per-create.md, "Fewer
indexes"), each index cost ~5 us of
PostgreSQL's CPU a delivery, and the runs -> jobs foreign key ~8 us (its check locks the
job's row FOR KEY SHARE, a write and a WAL record per run).

- ix_jobs_lease_expires and ix_jobs_target_running (both on running jobs) become one
  ix_jobs_running (target_id, lease_expires_at): running jobs are few (the schedulers'
  slots), so the reaper's scan of them all is short.
- ix_jobs_target goes; ix_jobs_tenant_active becomes (tenant_id, target_id), which also
  counts a target's unfinished jobs (a target in use is not deleted). Listing a tenant's
  jobs filtered by target walks ix_jobs_tenant_created instead.
- runs.job_id keeps its index but loses its foreign key: runs are written by the statement
  that holds their job's row, and retention deletes them with their job.

Revision ID: 0013
Revises: 0012
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RUNNING = sa.text("state = 'running'")
LIVE = sa.text("state NOT IN ('succeeded', 'dead', 'cancelled')")


def upgrade() -> None:
    op.create_index("ix_jobs_running", "jobs", ["target_id", "lease_expires_at"], postgresql_where=RUNNING)
    op.drop_index("ix_jobs_lease_expires", table_name="jobs")
    op.drop_index("ix_jobs_target_running", table_name="jobs")
    op.create_index("ix_jobs_tenant_target_active", "jobs", ["tenant_id", "target_id"], postgresql_where=LIVE)
    op.drop_index("ix_jobs_tenant_active", table_name="jobs")
    op.execute("ALTER INDEX ix_jobs_tenant_target_active RENAME TO ix_jobs_tenant_active")
    op.drop_index("ix_jobs_target", table_name="jobs")
    op.drop_constraint("fk_runs_job_id_jobs", "runs", type_="foreignkey")


def downgrade() -> None:
    # Runs whose job is gone would fail the restored foreign key.
    op.execute("DELETE FROM runs WHERE NOT EXISTS (SELECT 1 FROM jobs WHERE jobs.id = runs.job_id)")
    op.create_foreign_key("fk_runs_job_id_jobs", "runs", "jobs", ["job_id"], ["id"], ondelete="CASCADE")
    op.create_index("ix_jobs_target", "jobs", ["target_id"])
    op.create_index("ix_jobs_tenant_only_active", "jobs", ["tenant_id"], postgresql_where=LIVE)
    op.drop_index("ix_jobs_tenant_active", table_name="jobs")
    op.execute("ALTER INDEX ix_jobs_tenant_only_active RENAME TO ix_jobs_tenant_active")
    op.create_index("ix_jobs_target_running", "jobs", ["target_id"], postgresql_where=RUNNING)
    op.create_index("ix_jobs_lease_expires", "jobs", ["lease_expires_at"], postgresql_where=RUNNING)
    op.drop_index("ix_jobs_running", table_name="jobs")
