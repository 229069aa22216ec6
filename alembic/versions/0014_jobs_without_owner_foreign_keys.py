"""jobs: no foreign keys to tenants and targets

Each checked a created job's tenant and target with a query of its own per row (an SPI
statement in an AFTER trigger) that also share-locked their rows: every create of a tenant
then wrote a lock (and, with creates in flight together, a new MultiXact) on the one tenant
row. Measured on batch creates (bench/log/2026-11-26-one-statement-per-create.md), the two cost
~26 % of PostgreSQL's CPU a job; on single creates, ~6 %.

What they guaranteed holds without them:
- A job's target: every create inserts only when the target is a live target of the tenant,
  which the same statement share-locks (app/store/job_inserts.py); deleting a target takes the
  row's exclusive lock and refuses while the target has unfinished jobs. Targets are never
  deleted from the table, only marked deleted. Other inserts (occurrences, triggers, replays)
  copy the target of a job that has it.
- A job's tenant: tenants are never deleted (no code path does; the append-only audit log
  would refuse the cascade anyway).

Revision ID: 0014
Revises: 0013
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_constraint("fk_jobs_tenant_id_tenants", "jobs", type_="foreignkey")
    op.drop_constraint("fk_jobs_target_id_targets", "jobs", type_="foreignkey")


def downgrade() -> None:
    op.create_foreign_key("fk_jobs_target_id_targets", "jobs", "targets", ["target_id"], ["id"])
    op.create_foreign_key("fk_jobs_tenant_id_tenants", "jobs", "tenants", ["tenant_id"], ["id"], ondelete="CASCADE")
