"""jobs: NOTIFY when a job becomes due soon, and autovacuum tuned for a queue table

A statement-level trigger (one per INSERT and one per UPDATE statement, however many rows)
sends one NOTIFY on channel `cronhook_jobs_due` when the statement left a waiting job due
within the next minute (created, resumed, triggered, retried, replayed, rescheduled); the
payload is the earliest such run_at as epoch seconds. Schedulers LISTEN and wake at once
when it is earlier than their planned wake-up (app/services/due_listener.py). A minute is
the longest poll interval: anything later is found by the next poll anyway.

jobs is a queue: every claim and outcome leaves dead tuples in its partial due index, and
the default autovacuum (20 % of the table) let a drained backlog's dead entries slow the idle
claim 4.6 x on a 2M-row table (bench/log/2026-11-23-baseline.md). Vacuum it after 1 % (at least 1,000 rows).

Revision ID: 0007
Revises: 0006
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FUNCTION = """
CREATE FUNCTION cronhook_notify_due() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    earliest timestamptz;
BEGIN
    -- run_at is set exactly while a job waits (scheduled or retrying): CHECK waiting_iff_run_at.
    SELECT min(run_at) INTO earliest FROM changed_jobs WHERE run_at IS NOT NULL;
    IF earliest IS NOT NULL AND earliest < now() + interval '60 seconds' THEN
        PERFORM pg_notify('cronhook_jobs_due', extract(epoch FROM earliest)::text);
    END IF;
    RETURN NULL;
END
$$
"""


def upgrade() -> None:
    op.execute(FUNCTION)
    for event in ("INSERT", "UPDATE"):
        op.execute(
            f"CREATE TRIGGER jobs_notify_due_{event.lower()} AFTER {event} ON jobs "
            "REFERENCING NEW TABLE AS changed_jobs FOR EACH STATEMENT EXECUTE FUNCTION cronhook_notify_due()"
        )
    op.execute(
        "ALTER TABLE jobs SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000, "
        "autovacuum_vacuum_insert_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02)"
    )


def downgrade() -> None:
    op.execute(
        "ALTER TABLE jobs RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold, "
        "autovacuum_vacuum_insert_scale_factor, autovacuum_analyze_scale_factor)"
    )
    for event in ("insert", "update"):
        op.execute(f"DROP TRIGGER jobs_notify_due_{event} ON jobs")
    op.execute("DROP FUNCTION cronhook_notify_due()")
