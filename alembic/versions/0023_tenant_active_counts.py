"""Unfinished jobs per tenant, kept with the writes: the quota (max_active_jobs) reads a
counter instead of counting the tenant's live jobs, which with millions of them cost every
API process a scan of that many index entries a second.

Triggers on jobs append a delta (+1, -1) to tenant_job_deltas whenever a row becomes or stops
being unfinished: inserted live, its state crossing between live and finished, deleted live.
Every path that writes jobs (creates, batches, chains, triggers, events, replays, outcomes,
the reaper, cancels, deletes) is covered without each remembering to. An append is a heap and
an index insert, with no row lock taken, so concurrent creates and deliveries never wait on
one another or deadlock. The quota's read folds the tenant's pending deltas into its row of
tenant_job_counts (app/store/quotas.py) and returns it.

The triggers are created, then the counters filled by one count, in this migration's
transaction: creating a trigger holds off writes to jobs until it commits, so no change falls
between the count and the triggers.

Revision ID: 0023
Revises: 0022
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_LIVE_NEW = "NEW.state NOT IN ('succeeded', 'dead', 'cancelled')"
_LIVE_OLD = "OLD.state NOT IN ('succeeded', 'dead', 'cancelled')"


def upgrade() -> None:
    op.execute(
        "CREATE TABLE tenant_job_counts (tenant_id uuid PRIMARY KEY, active bigint NOT NULL) WITH (fillfactor = 50)"
    )
    # No primary key: rows only ever arrive and are folded away together.
    op.execute("CREATE TABLE tenant_job_deltas (tenant_id uuid NOT NULL, delta integer NOT NULL)")
    op.execute("CREATE INDEX ix_tenant_job_deltas_tenant ON tenant_job_deltas (tenant_id)")
    op.execute(
        f"""
CREATE FUNCTION tenant_job_delta() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO tenant_job_deltas VALUES (NEW.tenant_id, 1);
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO tenant_job_deltas VALUES (OLD.tenant_id, -1);
    ELSIF {_LIVE_NEW} THEN
        INSERT INTO tenant_job_deltas VALUES (NEW.tenant_id, 1);
    ELSE
        INSERT INTO tenant_job_deltas VALUES (NEW.tenant_id, -1);
    END IF;
    RETURN NULL;
END
$$"""
    )
    # WHEN is evaluated as the row is written: a write that crosses nothing queues no event
    # (a claim, a retry, a recurring job's next occurrence cost nothing here).
    op.execute(
        f"CREATE TRIGGER jobs_live_inserted AFTER INSERT ON jobs FOR EACH ROW WHEN ({_LIVE_NEW}) "
        "EXECUTE FUNCTION tenant_job_delta()"
    )
    op.execute(
        f"CREATE TRIGGER jobs_live_crossed AFTER UPDATE OF state ON jobs FOR EACH ROW "
        f"WHEN (({_LIVE_OLD}) IS DISTINCT FROM ({_LIVE_NEW})) EXECUTE FUNCTION tenant_job_delta()"
    )
    op.execute(
        f"CREATE TRIGGER jobs_live_deleted AFTER DELETE ON jobs FOR EACH ROW WHEN ({_LIVE_OLD}) "
        "EXECUTE FUNCTION tenant_job_delta()"
    )
    op.execute(
        "INSERT INTO tenant_job_counts (tenant_id, active) "
        "SELECT tenant_id, count(*) FROM jobs "
        "WHERE state NOT IN ('succeeded', 'dead', 'cancelled') GROUP BY tenant_id"
    )


def downgrade() -> None:
    for trigger in ("jobs_live_inserted", "jobs_live_crossed", "jobs_live_deleted"):
        op.execute(f"DROP TRIGGER IF EXISTS {trigger} ON jobs")
    op.execute("DROP FUNCTION IF EXISTS tenant_job_delta()")
    op.execute("DROP TABLE IF EXISTS tenant_job_deltas")
    op.execute("DROP TABLE IF EXISTS tenant_job_counts")
