"""jobs: one statement trigger for updated jobs, as 0024 made one for inserted jobs.

An UPDATE on jobs ran two triggers: the due-NOTIFY statement trigger (migration 0007) and
the quota's row trigger (migration 0023), which appended a -1 or +1 to tenant_job_deltas for
every row crossing between unfinished and finished. Every outcome batch of the scheduler
finishes most of its jobs, so it ran one PL/pgSQL call and wrote one delta row (a heap and an
index insert) per delivered job: about 15 us of PostgreSQL CPU per delivery, a fifth of the
outcome statement's (bench/claim_cost.py, pg_finish_us_per_job).

One statement trigger now does both, from the statement's old and new rows: per tenant, the
live rows after minus the live rows before, appended as one delta when it is not zero; and the
NOTIFY for the earliest job it left due within the minute. A batch of 100 deliveries of one
tenant appends one row instead of 100. A statement with no finished row before or after (a
claim, a heartbeat, a hold) crossed nothing and writes no delta: one look at its rows decides
(its old rows are kept for the statement, as its new rows already were for the NOTIFY).

A catalogue change in this migration's transaction: no update falls between the old triggers
and the new one.

Revision ID: 0025
Revises: 0024
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_FINISHED_STATES = "('succeeded', 'dead', 'cancelled')"
_LIVE = f"state NOT IN {_FINISHED_STATES}"
_FINISHED = f"state IN {_FINISHED_STATES}"

_UPDATED = f"""
CREATE FUNCTION cronhook_jobs_updated() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    earliest timestamptz;
    finished_any boolean;
BEGIN
    -- One look at the rows: the earliest job left waiting, and whether any row is finished
    -- before or after (no row crossed otherwise: a claim, a heartbeat, a hold).
    SELECT (SELECT min(run_at) FROM updated_new WHERE run_at IS NOT NULL),
           EXISTS (SELECT 1 FROM updated_new WHERE {_FINISHED})
           OR EXISTS (SELECT 1 FROM updated_old WHERE {_FINISHED})
      INTO earliest, finished_any;
    -- The quota's counters (migration 0023): per tenant, the jobs this statement made
    -- unfinished minus those it finished.
    IF finished_any THEN
        INSERT INTO tenant_job_deltas (tenant_id, delta)
            SELECT tenant_id, sum(delta) FROM (
                SELECT tenant_id, 1 AS delta FROM updated_new WHERE {_LIVE}
                UNION ALL
                SELECT tenant_id, -1 AS delta FROM updated_old WHERE {_LIVE}
            ) AS crossed
            GROUP BY tenant_id HAVING sum(delta) <> 0;
    END IF;
    -- Wake the schedulers for a job left due within the minute (migration 0007).
    IF earliest IS NOT NULL AND earliest < now() + interval '60 seconds' THEN
        PERFORM pg_notify('cronhook_jobs_due', extract(epoch FROM earliest)::text);
    END IF;
    RETURN NULL;
END
$$"""


def upgrade() -> None:
    op.execute(_UPDATED)
    op.execute("DROP TRIGGER jobs_live_crossed ON jobs")
    op.execute("DROP TRIGGER jobs_notify_due_update ON jobs")
    op.execute(
        "CREATE TRIGGER jobs_updated AFTER UPDATE ON jobs "
        "REFERENCING OLD TABLE AS updated_old NEW TABLE AS updated_new "
        "FOR EACH STATEMENT EXECUTE FUNCTION cronhook_jobs_updated()"
    )


def downgrade() -> None:
    # The functions the old triggers call were kept at 0025: tenant_job_delta (0023) still
    # serves the DELETE trigger; cronhook_notify_due (0007) waits for this way back.
    op.execute("DROP TRIGGER IF EXISTS jobs_updated ON jobs")
    op.execute("DROP FUNCTION IF EXISTS cronhook_jobs_updated()")
    op.execute(
        "CREATE TRIGGER jobs_live_crossed AFTER UPDATE OF state ON jobs FOR EACH ROW "
        f"WHEN ((OLD.{_LIVE}) IS DISTINCT FROM (NEW.{_LIVE})) EXECUTE FUNCTION tenant_job_delta()"
    )
    op.execute(
        "CREATE TRIGGER jobs_notify_due_update AFTER UPDATE ON jobs "
        "REFERENCING NEW TABLE AS changed_jobs FOR EACH STATEMENT EXECUTE FUNCTION cronhook_notify_due()"
    )
