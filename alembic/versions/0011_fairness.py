"""jobs: due jobs per tenant, for the claim that skips tenants at their share

While a tenant holds its whole share of a scheduler's delivery slots, the claim looks for
the other tenants' due jobs tenant by tenant (app/store/claim_ranking.py), one short probe
of this index per tenant and priority level, however deep the full tenant's backlog.

Revision ID: 0011
Revises: 0010
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_jobs_tenant_due",
        "jobs",
        ["tenant_id", "priority", "run_at"],
        postgresql_where=sa.text("state IN ('scheduled', 'retrying')"),
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_tenant_due", table_name="jobs")
