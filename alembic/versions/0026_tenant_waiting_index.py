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

Revision ID: 0026
Revises: 0025
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0026"
down_revision: str | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_UNFINISHED = "state NOT IN ('succeeded', 'dead', 'cancelled')"
_WAITING = "state NOT IN ('running', 'succeeded', 'dead', 'cancelled')"


def upgrade() -> None:
    op.create_index("ix_jobs_tenant_waiting", "jobs", ["tenant_id", "target_id"], postgresql_where=sa.text(_WAITING))
    op.drop_index("ix_jobs_tenant_active", table_name="jobs")


def downgrade() -> None:
    op.create_index("ix_jobs_tenant_active", "jobs", ["tenant_id", "target_id"], postgresql_where=sa.text(_UNFINISHED))
    op.drop_index("ix_jobs_tenant_waiting", table_name="jobs")
