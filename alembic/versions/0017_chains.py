"""chains: jobs that run after another job's occurrences settle, once per cause

A chained job (schedule_kind `after`) names its parent (`after_job_id`) and the outcome it
follows (`after_on`: success, failure or any). It has no fire time of its own (run_at stays
NULL while it is armed in state `scheduled`); each settled occurrence of the parent gives it
one occurrence, carried by a one-off job (`parent_job_id` the chained job) whose `cause_id` is
the parent occurrence's id. (parent_job_id, cause_id) is unique: settling is idempotent.
`fires_children` marks the jobs whose settling must look for chained children, so settling
any other job costs nothing (app/store/outcomes.py).

The CHECKs are replaced (a scan, no rewrite); the new columns are nullable or constant.

Revision ID: 0017
Revises: 0016
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import UUID

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("after_job_id", UUID(as_uuid=True)))
    op.add_column("jobs", sa.Column("after_on", sa.Text))
    op.add_column("jobs", sa.Column("payload_from", sa.Text))
    op.add_column("jobs", sa.Column("cause_id", UUID(as_uuid=True)))
    op.add_column("jobs", sa.Column("fires_children", sa.Boolean, nullable=False, server_default=sa.false()))
    op.drop_constraint("schedule_kind_valid", "jobs", type_="check")
    op.create_check_constraint("schedule_kind_valid", "jobs", "schedule_kind IN ('once', 'cron', 'interval', 'after')")
    op.drop_constraint("waiting_iff_run_at", "jobs", type_="check")
    op.create_check_constraint(
        "waiting_iff_run_at",
        "jobs",
        "(state IN ('scheduled', 'retrying') AND schedule_kind <> 'after') = (run_at IS NOT NULL)",
    )
    op.create_check_constraint(
        "after_fields_match_kind",
        "jobs",
        "(schedule_kind = 'after') = (after_job_id IS NOT NULL AND after_on IS NOT NULL) "
        "AND (after_on IS NULL OR after_on IN ('success', 'failure', 'any')) "
        "AND (payload_from IS NULL OR payload_from = 'parent_result')",
    )
    op.create_index("ix_jobs_after", "jobs", ["after_job_id"], postgresql_where=sa.text("after_job_id IS NOT NULL"))
    op.create_index(
        "ix_jobs_cause",
        "jobs",
        ["parent_job_id", "cause_id"],
        unique=True,
        postgresql_where=sa.text("cause_id IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_cause", "jobs")
    op.drop_index("ix_jobs_after", "jobs")
    op.drop_constraint("after_fields_match_kind", "jobs", type_="check")
    # Chained jobs have no schedule the older schema can hold: they go (their occurrences,
    # plain one-offs, stay).
    op.execute("DELETE FROM jobs WHERE schedule_kind = 'after'")
    op.drop_constraint("waiting_iff_run_at", "jobs", type_="check")
    op.create_check_constraint(
        "waiting_iff_run_at", "jobs", "(state IN ('scheduled', 'retrying')) = (run_at IS NOT NULL)"
    )
    op.drop_constraint("schedule_kind_valid", "jobs", type_="check")
    op.create_check_constraint("schedule_kind_valid", "jobs", "schedule_kind IN ('once', 'cron', 'interval')")
    for column in ("fires_children", "cause_id", "payload_from", "after_on", "after_job_id"):
        op.drop_column("jobs", column)
