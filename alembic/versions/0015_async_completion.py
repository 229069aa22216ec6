"""asynchronous completion: targets and jobs in `async` mode, open attempts, reported results

A 202 from an `async` target leaves the attempt open (the job stays running, held by no
replica) until the receiver reports on its completion URL or a deadline passes
(app/domain/completion.py). Runs gain the lease they were made under, which a completion
token names, and the receiver's result.

Every new column is nullable or has a default: adding them rewrites no table.

Revision ID: 0015
Revises: 0014
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB, UUID

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.add_column("targets", sa.Column("completion", sa.Text, nullable=False, server_default=sa.text("'sync'")))
    op.add_column("targets", sa.Column("async_timeout_s", sa.Integer))
    op.add_column("targets", sa.Column("heartbeat_timeout_s", sa.Integer))
    op.add_column(
        "targets", sa.Column("async_counts_in_flight", sa.Boolean, nullable=False, server_default=sa.text("true"))
    )
    op.create_check_constraint("completion_valid", "targets", "completion IN ('sync', 'async')")

    op.add_column("jobs", sa.Column("completion", sa.Text))
    op.add_column("jobs", sa.Column("async_timeout_s", sa.Integer))
    op.add_column("jobs", sa.Column("heartbeat_timeout_s", sa.Integer))
    op.add_column("jobs", sa.Column("async_deadline_at", _TS))
    op.add_column("jobs", sa.Column("awaiting_since", _TS))
    op.add_column("jobs", sa.Column("completion_token_hash", sa.Text))
    op.add_column("jobs", sa.Column("last_heartbeat_at", _TS))
    op.add_column("jobs", sa.Column("progress", sa.SmallInteger))
    op.add_column("jobs", sa.Column("progress_message", sa.Text))
    op.add_column("jobs", sa.Column("pause_requested_at", _TS))
    op.create_check_constraint("completion_valid", "jobs", "completion IS NULL OR completion IN ('sync', 'async')")
    op.create_check_constraint(
        "async_open_iff_deadline",
        "jobs",
        "(lease_owner IS NOT DISTINCT FROM '~async') = (async_deadline_at IS NOT NULL)",
    )
    op.create_check_constraint(
        "progress_range",
        "jobs",
        "(progress IS NULL OR progress BETWEEN 0 AND 100) AND "
        "(progress_message IS NULL OR char_length(progress_message) <= 200)",
    )

    op.add_column("runs", sa.Column("lease_token", UUID(as_uuid=True)))
    op.add_column("runs", sa.Column("result", JSONB))
    op.add_column("runs", sa.Column("reported_at", _TS))
    op.add_column("runs", sa.Column("fenced_at", _TS))
    op.drop_constraint("outcome_valid", "runs", type_="check")
    op.create_check_constraint(
        "outcome_valid",
        "runs",
        "outcome IN ('success', 'http_error', 'timeout', 'connection_error', 'lease_expired', 'missed', "
        "'skipped_overlap', 'failed', 'async_timeout', 'heartbeat_timeout', 'cancelled')",
    )


def downgrade() -> None:
    op.drop_constraint("outcome_valid", "runs", type_="check")
    op.execute("DELETE FROM runs WHERE outcome IN ('failed', 'async_timeout', 'heartbeat_timeout', 'cancelled')")
    op.create_check_constraint(
        "outcome_valid",
        "runs",
        "outcome IN ('success', 'http_error', 'timeout', 'connection_error', 'lease_expired', 'missed', "
        "'skipped_overlap')",
    )
    for column in ("fenced_at", "reported_at", "result", "lease_token"):
        op.drop_column("runs", column)
    for name in ("progress_range", "async_open_iff_deadline", "completion_valid"):
        op.drop_constraint(name, "jobs", type_="check")
    for column in (
        "pause_requested_at",
        "progress_message",
        "progress",
        "last_heartbeat_at",
        "completion_token_hash",
        "awaiting_since",
        "async_deadline_at",
        "heartbeat_timeout_s",
        "async_timeout_s",
        "completion",
    ):
        op.drop_column("jobs", column)
    op.drop_constraint("completion_valid", "targets", type_="check")
    for column in ("async_counts_in_flight", "heartbeat_timeout_s", "async_timeout_s", "completion"):
        op.drop_column("targets", column)
