"""jobs: the unfinished-jobs index by tenant and target leaves running jobs out.

ix_jobs_tenant_active (tenant_id, target_id), partial on unfinished jobs, took a new entry
at every claim: a running job is unfinished, and a claim writes a new version of the row into
every index whose predicate it meets. Running jobs are already in ix_jobs_running
(target_id, lease_expires_at), which the claim writes anyway. The index now holds the waiting
jobs only (scheduled, retrying, paused, waiting on a parent, held), as ix_jobs_tenant_waiting;
"a target's unfinished jobs" is its waiting jobs here plus its running ones there
(app/store/targets.py). One index entry less per delivery: ~10 % of the claim's PostgreSQL
CPU (bench/claim_cost.py, pg_claim_us_per_job, 3 pairs run side by side: 52.7 / 46.8 / 44.7
-> 45.2 / 41.9 / 41.1 us a job).

The new index is built by one read of jobs, and the migration's transaction holds off writes
to jobs for that long; on a very large table build it first by hand with CONCURRENTLY (IF NOT
EXISTS then skips it), and drop the old one likewise afterwards.

Revision ID: 0026
Revises: 0025
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0026"
down_revision: str | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_UNFINISHED = "state NOT IN ('succeeded', 'dead', 'cancelled')"
_WAITING = "state NOT IN ('running', 'succeeded', 'dead', 'cancelled')"


def upgrade() -> None:
    op.execute(f"CREATE INDEX IF NOT EXISTS ix_jobs_tenant_waiting ON jobs (tenant_id, target_id) WHERE {_WAITING}")
    op.execute("DROP INDEX IF EXISTS ix_jobs_tenant_active")


def downgrade() -> None:
    op.execute(f"CREATE INDEX IF NOT EXISTS ix_jobs_tenant_active ON jobs (tenant_id, target_id) WHERE {_UNFINISHED}")
    op.execute("DROP INDEX IF EXISTS ix_jobs_tenant_waiting")
