"""replicas: the server instance each heartbeat was written on

The reaper rescues a replica's jobs at once when its heartbeat has lapsed and none of its
sessions is left, but only on the server instance the heartbeat was written on
(pg_postmaster_start_time() then and now): after a restart or a failover to a standby, no
session is left for anyone and proves nothing (app/store/rescues.py).

Revision ID: 0012
Revises: 0011
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("replicas", sa.Column("server_started_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("replicas", "server_started_at")
