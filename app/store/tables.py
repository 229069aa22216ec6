"""The schema, defined once. Alembic migrations are checked against it by a test."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Double,
    Enum,
    ForeignKey,
    Identity,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    Table,
    Text,
    UniqueConstraint,
    cast,
    literal_column,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID
from sqlalchemy.sql.elements import ColumnElement

from app.domain.chains import ChainOn
from app.domain.completion import ASYNC_OWNER, CompletionMode
from app.domain.job import RunOutcome
from app.domain.partition import PARTITION_COUNT
from app.domain.priority import MAX_PRIORITY, MIN_PRIORITY
from app.domain.states import CLAIMABLE_STATES, TERMINAL_STATES, JobState

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

job_state = Enum(
    JobState,
    name="job_state",
    values_callable=lambda states: [s.value for s in states],
    validate_strings=True,
)


def _state_in(states: frozenset[JobState] | tuple[JobState, ...], negated: bool = False) -> str:
    """SQL text for "state is one of `states`" (index predicates and CHECKs), from the domain's
    state sets, spelled as the claim and retention statements spell it."""
    listed = ", ".join(repr(state.value) for state in JobState if state in states)
    return f"state {'NOT IN' if negated else 'IN'} ({listed})"


_STATE_CLAIMABLE = _state_in(CLAIMABLE_STATES)
_STATE_TERMINAL = _state_in(TERMINAL_STATES)
_STATE_LIVE = _state_in(TERMINAL_STATES, negated=True)
# Jobs in none of these are waiting: for a fire time, a backoff, a resume (ix_jobs_tenant_waiting).
NOT_WAITING_STATES: frozenset[JobState] = TERMINAL_STATES | {JobState.RUNNING}
_STATE_WAITING = _state_in(NOT_WAITING_STATES, negated=True)

NOW = text("now()")
# A dedup_key is held by the tenant's unfinished jobs only.
DEDUP_KEY_LIVE = f"dedup_key IS NOT NULL AND {_STATE_LIVE}"


def _one_of(column: str, values: type[enum.StrEnum]) -> str:
    """The CHECK that mirrors a domain enum: the column holds one of its values."""
    return f"{column} IN ({', '.join(repr(member.value) for member in values)})"


def _ts(name: str, nullable: bool = True, default_now: bool = False) -> Column[object]:
    return Column(name, DateTime(timezone=True), nullable=nullable, server_default=NOW if default_now else None)


tenants = Table(
    "tenants",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True, server_default=text("gen_random_uuid()")),
    Column("name", Text, nullable=False, unique=True),
    _ts("created_at", nullable=False, default_now=True),
    # An operator's pause of the whole tenant (POST /v1/admin/tenants/{t}/pause): its due
    # occurrences are held as a paused target's are, until resumed (or `paused_until`).
    _ts("paused_at"),
    _ts("paused_until"),
    Column("paused_reason", Text),
)

api_keys = Table(
    "api_keys",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True, server_default=text("gen_random_uuid()")),
    Column("tenant_id", UUID(as_uuid=True), ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False),
    # SHA-256 of the key; the key itself is never stored.
    Column("key_hash", Text, nullable=False, unique=True),
    # The visible part (`chk_live_<id>`), so an operator can tell keys apart without the secret.
    Column("key_prefix", Text, nullable=False),
    Column("name", Text),
    # `bootstrap`: CRONHOOK_BOOTSTRAP_API_KEY, retired when start-up sees another one.
    Column("kind", Text, nullable=False, server_default=text("'tenant'")),
    _ts("created_at", nullable=False, default_now=True),
    _ts("revoked_at"),
    CheckConstraint("kind IN ('tenant', 'bootstrap')", name="kind_valid"),
)

# Per-tenant quota overrides; NULL = the setting's default (CRONHOOK_TENANT_*).
tenant_limits = Table(
    "tenant_limits",
    metadata,
    Column("tenant_id", UUID(as_uuid=True), ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True),
    Column("requests_per_s", Double),
    Column("max_active_jobs", Integer),
    Column("max_targets", Integer),
    Column("min_interval_s", Integer),
    Column("min_backoff_base_s", Double),
    Column("max_attempts", Integer),
    # Schedule health's defaults for the tenant's jobs without an `expect` of their own.
    Column("expect_success_within_s", Integer),
    Column("expect_max_consecutive_failures", Integer),
    _ts("updated_at", nullable=False, default_now=True),
)

# The API's request rate per tenant across replicas: a token bucket each replica draws from
# in small chunks (app/api/rate_limit.py).
api_rate_buckets = Table(
    "api_rate_buckets",
    metadata,
    Column("tenant_id", UUID(as_uuid=True), ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True),
    Column("tokens", Double, nullable=False),
    Column("granted", Double, nullable=False),
    _ts("updated_at", nullable=False, default_now=True),
)

# Unfinished jobs per tenant, kept with the writes (migrations 0023-0025): triggers on jobs
# append deltas whenever rows become or stop being unfinished (an INSERT or UPDATE statement
# one per tenant, its net change; a delete of an unfinished job -1); the quota's read folds a
# tenant's deltas into its counter (app/store/quotas.py).
tenant_job_counts = Table(
    "tenant_job_counts",
    metadata,
    Column("tenant_id", UUID(as_uuid=True), primary_key=True),
    Column("active", BigInteger, nullable=False),
    postgresql_with={"fillfactor": "50"},
)
tenant_job_deltas = Table(
    "tenant_job_deltas",
    metadata,
    Column("tenant_id", UUID(as_uuid=True), nullable=False),
    Column("delta", Integer, nullable=False),
    Index("ix_tenant_job_deltas_tenant", "tenant_id"),
)

# Every mutation, append-only (a trigger refuses UPDATE and DELETE): who, what, when. Never
# secrets or payloads: only ids.
audit_log = Table(
    "audit_log",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("tenant_id", UUID(as_uuid=True), nullable=False),
    # The API key used; NULL for the admin key and the CLI (`actor` says which).
    Column("api_key_id", UUID(as_uuid=True)),
    Column("actor", Text, nullable=False),
    Column("action", Text, nullable=False),
    Column("object_id", Text),
    Column("request_id", Text),
    _ts("created_at", nullable=False, default_now=True),
    Index("ix_audit_log_tenant_id", "tenant_id", "id"),
)

targets = Table(
    "targets",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True, server_default=text("gen_random_uuid()")),
    Column("tenant_id", UUID(as_uuid=True), ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False),
    Column("name", Text, nullable=False),
    Column("url", Text, nullable=False),
    Column("headers", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("timeout_s", Double, nullable=False),
    # Statuses to retry instead of the default set (5xx, 408, 425, 429, 3xx); NULL = default.
    Column("retry_on_status", ARRAY(SmallInteger)),
    # Sealed (app/keyring.py; header values too): opened only to sign, and returned only on
    # create and rotate. After a rotation the previous secret also signs until its expiry.
    Column("signing_secret", Text, nullable=False),
    Column("previous_signing_secret", Text),
    _ts("previous_secret_expires_at"),
    # Delivery limits across all replicas (NULL = unlimited): deliveries in flight at once,
    # and a token bucket of `rate_per_s` refilled continuously, holding at most one second's
    # worth (`rate_tokens` as of `rate_updated_at`).
    Column("max_in_flight", Integer),
    Column("rate_per_s", Double),
    Column("rate_tokens", Double),
    _ts("rate_updated_at"),
    # Asynchronous completion (app/domain/completion.py): `async` leaves a 202's attempt open
    # until the receiver reports; NULL timeouts take the defaults (3,600 s; no heartbeat).
    Column("completion", Text, nullable=False, server_default=text("'sync'")),
    Column("async_timeout_s", Integer),
    Column("heartbeat_timeout_s", Integer),
    # Whether open asynchronous attempts count against max_in_flight (they do by default).
    Column("async_counts_in_flight", Boolean, nullable=False, server_default=text("true")),
    # Key/value pairs to find targets by (?label=team=payments).
    Column("labels", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    # Pause and hold (POST /v1/targets/{id}/pause): while paused_at is set no occurrence of
    # the target is claimed; due ones are held (jobs.held_run_at) until resumed, or until
    # `paused_until`. `pause_kind` auto: tripped by auto_pause_failures failed attempts in a
    # row across its jobs (`consecutive_failures`, kept by the outcome statement).
    _ts("paused_at"),
    _ts("paused_until"),
    Column("paused_reason", Text),
    Column("pause_kind", Text),
    Column("auto_pause_failures", Integer),
    Column("consecutive_failures", Integer, nullable=False, server_default=text("0")),
    _ts("created_at", nullable=False, default_now=True),
    _ts("updated_at", nullable=False, default_now=True),
    _ts("deleted_at"),
    CheckConstraint("timeout_s > 0", name="timeout_positive"),
    CheckConstraint(
        "(paused_at IS NULL) = (pause_kind IS NULL) AND (pause_kind IS NULL OR pause_kind IN ('manual', 'auto'))",
        name="pause_kind_valid",
    ),
    CheckConstraint("auto_pause_failures IS NULL OR auto_pause_failures >= 1", name="auto_pause_positive"),
    CheckConstraint("max_in_flight IS NULL OR max_in_flight >= 1", name="max_in_flight_positive"),
    CheckConstraint("rate_per_s IS NULL OR rate_per_s > 0", name="rate_positive"),
    CheckConstraint(_one_of("completion", CompletionMode), name="completion_valid"),
    Index("ix_targets_tenant_created", "tenant_id", "created_at", "id"),
)

jobs = Table(
    "jobs",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    # No foreign keys to tenants and targets (migration 0014): each cost a query and a lock on
    # the owner's row per created job. Creates insert only for a live target of the tenant,
    # share-locked by the INSERT itself (app/store/job_inserts.py).
    Column("tenant_id", UUID(as_uuid=True), nullable=False),
    Column("target_id", UUID(as_uuid=True), nullable=False),
    # Stable hash of the id (app/domain/partition.py); the unit of scheduler ownership and a
    # ready-made distribution key should the table ever be sharded.
    Column("partition", SmallInteger, nullable=False),
    Column("name", Text),
    Column("payload", JSONB, nullable=False),
    Column("priority", SmallInteger, nullable=False, server_default=text("0")),
    Column("state", job_state, nullable=False),
    # Schedule: exactly one kind, with its fields.
    Column("schedule_kind", Text, nullable=False),
    Column("cron", Text),
    # A cron expression as written, when it holds hashed values (`H`); `cron` is then the
    # resolved expression every fire-time computation reads (app/domain/cron_hash.py).
    Column("cron_source", Text),
    Column("timezone", Text, nullable=False, server_default=text("'UTC'")),
    Column("every_s", Integer),
    Column("interval_mode", Text, nullable=False, server_default=text("'fixed_rate'")),
    # What to do with fire times that passed while the job could not run (app/domain/occurrences.py).
    Column("misfire_policy", Text, nullable=False, server_default=text("'fire_once'")),
    Column("misfire_grace_s", Double, nullable=False, server_default=text("60")),
    Column("catch_up_limit", Integer, nullable=False, server_default=text("10")),
    Column("overlap_policy", Text, nullable=False, server_default=text("'forbid'")),
    # Each occurrence fires up to this many seconds after its nominal time (run_at holds the
    # delayed time, scheduled_for the nominal one; app/domain/schedule.py: jitter_delay).
    Column("jitter_s", Integer, nullable=False, server_default=text("0")),
    # Bounds of a recurring schedule; past them the job ends `succeeded` with `ended_reason`.
    _ts("start_at"),
    _ts("end_at"),
    Column("max_runs", Integer),
    Column("ended_reason", Text),
    # Unique among the tenant's unfinished jobs (a second create is a 409).
    Column("dedup_key", Text),
    # Fixed-rate interval schedules count from here (the first fire time).
    _ts("schedule_anchor_at", nullable=False),
    # The current occurrence: its nominal fire time and an id stable across its retries
    # (the webhook-id), replaced when the next occurrence starts.
    _ts("scheduled_for", nullable=False),
    Column("occurrence_id", UUID(as_uuid=True), nullable=False),
    # When the job may next be claimed: the fire time, or the end of a retry backoff.
    _ts("run_at"),
    # Attempts made for the current occurrence.
    Column("attempt", Integer, nullable=False, server_default=text("0")),
    # When the current occurrence's first attempt was claimed: fire times due by then were a
    # backlog (the misfire policy's), not overlaps, even when that attempt is retried.
    _ts("occurrence_claimed_at"),
    Column("max_attempts", Integer, nullable=False),
    Column("backoff_base_s", Double, nullable=False),
    Column("backoff_max_s", Double, nullable=False),
    Column("backoff_factor", Double, nullable=False, server_default=text("2")),
    # Lease of the scheduler delivering it (state running).
    Column("lease_owner", Text),
    Column("lease_token", UUID(as_uuid=True)),
    _ts("lease_expires_at"),
    Column("last_status_code", Integer),
    Column("last_error", Text),
    Column("occurrences_run", BigInteger, nullable=False, server_default=text("0")),
    # The job's own completion settings; NULL = its target's (app/domain/completion.py).
    Column("completion", Text),
    Column("async_timeout_s", Integer),
    Column("heartbeat_timeout_s", Integer),
    # An open asynchronous attempt (state running, lease_owner ASYNC_OWNER): when it must
    # end at the latest (lease_expires_at is the earlier of this and the heartbeat deadline),
    # since when it is open, the token's SHA-256, and the receiver's last report of progress.
    # Cleared with the lease (NO_LEASE), so they only ever describe the current attempt.
    _ts("async_deadline_at"),
    _ts("awaiting_since"),
    Column("completion_token_hash", Text),
    _ts("last_heartbeat_at"),
    Column("progress", SmallInteger),
    Column("progress_message", Text),
    # A pause asked for while an async attempt was open: applied when the attempt ends (a
    # long attempt is neither interrupted nor makes the pause wait for it to be retried).
    _ts("pause_requested_at"),
    # The recurring job this one-off carries an occurrence of: a trigger, or (overlap_policy
    # allow) an occurrence handed off so the next can start while it is in flight.
    Column("parent_job_id", UUID(as_uuid=True), ForeignKey("jobs.id", ondelete="SET NULL")),
    # A chained job (schedule_kind after, app/domain/chains.py): its parent, the outcome it
    # follows and where its payload comes from; armed while `scheduled` with no run_at.
    Column("after_job_id", UUID(as_uuid=True)),
    Column("after_on", Text),
    Column("payload_from", Text),
    # An occurrence of a chained job (a one-off whose parent_job_id is the chained job): the
    # parent occurrence that caused it. (parent_job_id, cause_id) is unique: once per cause.
    Column("cause_id", UUID(as_uuid=True)),
    # Settling this job's occurrences may fire chained children: only such rows pay for the
    # look-up (app/store/outcomes.py).
    Column("fires_children", Boolean, nullable=False, server_default=text("false")),
    # A named schedule's key (PUT /v1/schedules/{key}): unique among the tenant's unfinished jobs.
    Column("schedule_key", Text),
    # The declarative set a named schedule belongs to (PUT /v1/schedule-sets/{set}), if any.
    Column("schedule_set", Text),
    # Key/value pairs to find jobs by (?label=team=payments); at most 16 (the API's check).
    Column("labels", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    # Schedule health (app/domain/health.py), kept by the outcome statement: when an
    # occurrence last succeeded and last failed (dead-lettered or missed), and failed
    # occurrences since the last success. `expect_*`: the job's thresholds (NULL: the
    # tenant's, then the settings'). `health_alert`: `failing` once job.health.failing was
    # emitted, until job.health.recovered is (edge-triggered events).
    _ts("last_success_at"),
    _ts("last_failure_at"),
    Column("consecutive_failures", Integer, nullable=False, server_default=text("0")),
    Column("expect_success_within_s", Integer),
    Column("expect_max_consecutive_failures", Integer),
    Column("health_alert", Text),
    # Per-job callbacks: an event to this target once per occurrence that succeeded / failed.
    Column("on_success_target_id", UUID(as_uuid=True)),
    Column("on_failure_target_id", UUID(as_uuid=True)),
    # An event's delivery (app/domain/events.py): never itself the subject of an event.
    Column("event_type", Text),
    # A held occurrence (its target or tenant paused): the run_at it had; run_at is then
    # 'infinity', out of every claim's due range, until the resume sets it again.
    _ts("held_run_at"),
    # When a deliberate pause of the job (or its target's or tenant's hold) last ended: fire
    # times it kept from running are not failures, and a success deadline counts from here.
    _ts("resumed_at"),
    _ts("created_at", nullable=False, default_now=True),
    _ts("updated_at", nullable=False, default_now=True),
    _ts("finished_at"),
    # CHECKs cost every INSERT and UPDATE statement on jobs: PostgreSQL reads each stored
    # expression back from its text form and prepares it, per statement. Kept are the
    # invariants the scheduler's statements rely on and the ranges that would strand a job
    # (a partition no replica owns, a priority level the claim never visits); a value's range
    # or spelling that the API's models refuse, and only domain code writes, is not re-checked
    # here (migration 0024).
    CheckConstraint(f"partition >= 0 AND partition < {PARTITION_COUNT}", name="partition_range"),
    CheckConstraint(
        "(schedule_kind = 'cron') = (cron IS NOT NULL) AND (schedule_kind = 'interval') = (every_s IS NOT NULL)",
        name="schedule_fields_match_kind",
    ),
    CheckConstraint("every_s IS NULL OR every_s > 0", name="every_s_positive"),
    CheckConstraint(f"priority BETWEEN {MIN_PRIORITY} AND {MAX_PRIORITY}", name="priority_range"),
    CheckConstraint("max_attempts >= 1", name="max_attempts_positive"),
    CheckConstraint("attempt >= 0 AND attempt <= max_attempts", name="attempt_within_max"),
    CheckConstraint(
        "(state = 'running') = (lease_token IS NOT NULL AND lease_expires_at IS NOT NULL AND lease_owner IS NOT NULL)",
        name="running_iff_leased",
    ),
    CheckConstraint(
        f"({_STATE_CLAIMABLE} AND schedule_kind <> 'after') = (run_at IS NOT NULL)",
        name="waiting_iff_run_at",
    ),
    CheckConstraint(
        "(schedule_kind = 'after') = (after_job_id IS NOT NULL AND after_on IS NOT NULL) "
        f"AND (after_on IS NULL OR {_one_of('after_on', ChainOn)}) "
        "AND (payload_from IS NULL OR payload_from = 'parent_result')",
        name="after_fields_match_kind",
    ),
    CheckConstraint(
        f"(lease_owner IS NOT DISTINCT FROM '{ASYNC_OWNER}') = (async_deadline_at IS NOT NULL)",
        name="async_open_iff_deadline",
    ),
    # The scheduler's claim: due jobs per priority level in run_at order.
    Index(
        "ix_jobs_due",
        "priority",
        "run_at",
        postgresql_where=text(_STATE_CLAIMABLE),
    ),
    # Due jobs per tenant: the claim that skips tenants at their share (migration 0011).
    Index(
        "ix_jobs_tenant_due",
        "tenant_id",
        "priority",
        "run_at",
        postgresql_where=text(_STATE_CLAIMABLE),
    ),
    # Per-partition due jobs: the cluster view's lag, and a shard-local claim should the
    # table ever be distributed by partition.
    Index(
        "ix_jobs_partition_due",
        "partition",
        "run_at",
        postgresql_where=text(_STATE_CLAIMABLE),
    ),
    # Every claim and every outcome writes a new version of the row into each index whose
    # predicate it meets, so indexes are few (migration 0013): each cost ~5 us a delivery.
    # Running jobs, few at any time (the schedulers' slots): deliveries in flight per target
    # (max_in_flight), and the reaper's expired leases (a scan of them all, then a sort).
    Index("ix_jobs_running", "target_id", "lease_expires_at", postgresql_where=text("state = 'running'")),
    Index("ix_jobs_tenant_created", "tenant_id", "created_at", "id"),
    # A tenant's and a target's waiting jobs; with ix_jobs_running, their unfinished ones
    # (app/store/targets.py: a target in use is not deleted). Running jobs are left out: a
    # claim would write an entry here too (migration 0026).
    Index(
        "ix_jobs_tenant_waiting",
        "tenant_id",
        "target_id",
        postgresql_where=text(_STATE_WAITING),
    ),
    Index("ix_jobs_parent", "parent_job_id", postgresql_where=text("parent_job_id IS NOT NULL")),
    # The health pass's jobs (app/services/watchdog.py): unfinished jobs in a failure streak,
    # with a success deadline, or alerted. Healthy jobs without `expect` are not in it, so the
    # outcome statement writes no entry for them.
    Index(
        "ix_jobs_health_watch",
        "id",
        postgresql_where=text(
            "(consecutive_failures > 0 OR expect_success_within_s IS NOT NULL OR health_alert IS NOT NULL) "
            f"AND event_type IS NULL AND {_STATE_LIVE}"
        ),
    ),
    # A paused target's held occurrences, released by its resume.
    Index("ix_jobs_held", "target_id", "held_run_at", postgresql_where=text("held_run_at IS NOT NULL")),
    # A parent's chained children (settling, cancelling), and one occurrence per cause.
    Index("ix_jobs_after", "after_job_id", postgresql_where=text("after_job_id IS NOT NULL")),
    Index("ix_jobs_cause", "parent_job_id", "cause_id", unique=True, postgresql_where=text("cause_id IS NOT NULL")),
    Index(
        "ix_jobs_schedule_key",
        "tenant_id",
        "schedule_key",
        unique=True,
        postgresql_where=text(f"schedule_key IS NOT NULL AND {_STATE_LIVE}"),
    ),
    # Retention: finished jobs, oldest first (app/store/retention.py).
    Index(
        "ix_jobs_finished",
        "finished_at",
        postgresql_where=text(_STATE_TERMINAL),
    ),
    Index(
        "ix_jobs_tenant_dedup_key",
        "tenant_id",
        "dedup_key",
        unique=True,
        postgresql_where=text(DEDUP_KEY_LIVE),
    ),
)

runs = Table(
    "runs",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    # No foreign key: its check locked (and so rewrote) the job's row for every run written,
    # ~8 us a delivery. Runs are written only with their job's row locked by the same
    # statement (app/store/outcomes.py), and deleted with it (app/store/retention.py).
    Column("job_id", UUID(as_uuid=True), nullable=False),
    Column("tenant_id", UUID(as_uuid=True), nullable=False),
    Column("occurrence_id", UUID(as_uuid=True), nullable=False),
    _ts("scheduled_for", nullable=False),
    # When its occurrence was set to fire, when that was not scheduled_for (a jittered one).
    _ts("fire_at"),
    Column("attempt", Integer, nullable=False),
    Column("replica_id", Text),
    _ts("started_at"),
    _ts("finished_at", nullable=False, default_now=True),
    Column("status_code", Integer),
    Column("duration_ms", Integer),
    Column("outcome", Text, nullable=False),
    Column("error", Text),
    # The lease the attempt was made under: what a completion token names (a late report
    # finds its run by it, app/store/completions.py).
    Column("lease_token", UUID(as_uuid=True)),
    # Asynchronous attempts: the receiver's result, when it reported (a second report is a
    # 409), and when a report came for an attempt that had already ended otherwise (410).
    Column("result", JSONB),
    _ts("reported_at"),
    _ts("fenced_at"),
    CheckConstraint(_one_of("outcome", RunOutcome), name="outcome_valid"),
    Index("ix_runs_job", "job_id", "id"),
    # The delivery statistics' window (migration 0022): appended in this order, so BRIN.
    Index(
        "ix_runs_finished_brin",
        "finished_at",
        postgresql_using="brin",
        postgresql_with={"autosummarize": "on"},
    ),
)

dead_letters = Table(
    "dead_letters",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True, server_default=text("gen_random_uuid()")),
    Column("tenant_id", UUID(as_uuid=True), ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False),
    Column("job_id", UUID(as_uuid=True), ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("target_id", UUID(as_uuid=True), nullable=False),
    Column("occurrence_id", UUID(as_uuid=True), nullable=False),
    _ts("scheduled_for", nullable=False),
    Column("payload", JSONB, nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("last_status_code", Integer),
    Column("last_error", Text),
    _ts("created_at", nullable=False, default_now=True),
    # The latest replay of this dead letter: a new one-off job.
    _ts("replayed_at"),
    Column("replay_job_id", UUID(as_uuid=True)),
    # One dead letter per occurrence, even if two processes race to write it.
    UniqueConstraint("occurrence_id"),
    Index("ix_dead_letters_tenant_created", "tenant_id", "created_at", "id"),
    # Retention: whether a finished job still has a dead letter, and the oldest dead letters.
    Index("ix_dead_letters_job", "job_id"),
    Index("ix_dead_letters_created", "created_at"),
)

# Scheduler replicas announce themselves here; a replica whose `expires_at` has passed is
# gone, and the others divide its partitions among themselves.
replicas = Table(
    "replicas",
    metadata,
    Column("id", Text, primary_key=True),
    _ts("started_at", nullable=False, default_now=True),
    _ts("heartbeat_at", nullable=False, default_now=True),
    _ts("expires_at", nullable=False),
    # pg_postmaster_start_time() at the last heartbeat: the server instance it was written on
    # (app/store/rescues.py; migration 0012).
    _ts("server_started_at"),
)

# One row per virtual partition (created by migration 0003): who may claim its jobs, until
# when, and an epoch that rises on every acquisition, so a stale owner is told apart from
# a current one even if it uses the same name.
partition_leases = Table(
    "partition_leases",
    metadata,
    Column("partition", SmallInteger, primary_key=True, autoincrement=False),
    Column("owner", Text),
    Column("epoch", BigInteger, nullable=False, server_default=text("0")),
    _ts("expires_at"),
    _ts("acquired_at"),
    CheckConstraint(f"partition >= 0 AND partition < {PARTITION_COUNT}", name="partition_range"),
    CheckConstraint("(owner IS NULL) = (expires_at IS NULL)", name="owner_iff_expiry"),
)

# Idempotency-Key: the first response to a (tenant, endpoint, key), replayed for 24 hours to
# a retry with the same body. The row is inserted in the request's own transaction, so a
# concurrent duplicate waits on it and then sees the committed response.
idempotency_keys = Table(
    "idempotency_keys",
    metadata,
    Column("tenant_id", UUID(as_uuid=True), ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True),
    Column("endpoint", Text, primary_key=True),
    Column("key", Text, primary_key=True),
    # SHA-256 of the canonical request body: the same key with another body is refused.
    Column("request_hash", Text, nullable=False),
    Column("status_code", Integer),
    Column("response", JSONB),
    _ts("created_at", nullable=False, default_now=True),
    Index("ix_idempotency_keys_created", "created_at"),
)


# Constants in the SQL text. A prepared statement's generic plan (PostgreSQL's choice after
# five runs) cannot prove a partial index's predicate from a bind parameter: `state IN ($1,
# $2)` or `priority = $3` turns the claim's index probes into sequential scans (90 ms where
# the custom plan takes 6), so PostgreSQL plans every run afresh instead. Spelled as
# constants, the text is still built once and the generic plan uses the indexes.
def state_in(states: Iterable[JobState], column: ColumnElement[Any] | None = None) -> ColumnElement[bool]:
    """`column` (jobs.state by default) is one of `states`, the states written as constants."""
    state_column: ColumnElement[Any] = jobs.c.state if column is None else column
    wanted = set(states)
    return state_column.in_([literal_column(f"'{state.value}'") for state in JobState if state in wanted])


def state_in_rows_by_id(states: Iterable[JobState]) -> ColumnElement[bool]:
    """state_in for a batch that finds its jobs by id (an array of ids unnested and joined on
    jobs.id): the guard is the same, spelled through a cast to text so that PostgreSQL cannot
    prove a partial index's predicate from it, and the batch's ids drive the plan through the
    primary key. Left to choose, it drove the outcomes' batch with ix_jobs_running, reading
    every running job for each batch, and with ANALYZE's estimate of one running job (taken
    while none was) as a nested loop that unnested the whole batch again for each of them:
    290 us of PostgreSQL time per delivery instead of 56 in a 50,000-job drain
    (bench/log/2026-11-28-outcome-plan.md)."""
    return state_in(states, column=cast(jobs.c.state, Text))


def int_constant(value: int) -> ColumnElement[Any]:
    """An integer written into the SQL text (a priority level of the claim's scans)."""
    return literal_column(str(int(value)))
