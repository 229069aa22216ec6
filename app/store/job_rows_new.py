"""A new job as a row, beside job_rows.py (rows read back): the columns an INSERT of new jobs
sets, in one order, and a job's values in that order (a tuple per job, the parts jobs share
built once), transposed into one typed array per column for the INSERTs of
app/store/job_inserts.py. The payload arrives as text, encoded above the store
(app/domain/payload.py)."""

from __future__ import annotations

import datetime as dt
import json
import operator
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from sqlalchemy import Double, Integer, SmallInteger, Text
from sqlalchemy.dialects.postgresql import UUID
from sqlalchemy.sql.type_api import TypeEngine

from app.domain.job import NewJob
from app.domain.occurrences import Recurrence
from app.domain.partition import partition_for
from app.domain.retry import RetryPolicy
from app.domain.schedule import EARLIEST_RUN_AT, OnceSchedule, Schedule, ScheduleKind, jitter_delay
from app.ids import new_id, new_ids
from app.store.job_rows import policy_columns, recurrence_columns, schedule_columns
from app.store.tables import jobs

_UUID = UUID(as_uuid=True)
_TS = jobs.c.scheduled_for.type

# The columns a new job sets, each sent as one typed array (the payload as JSON text, cast
# in SQL: serialised once, and asyncpg encodes a text[] without a per-element codec).
NEW_JOB_COLUMNS: tuple[tuple[str, TypeEngine[Any]], ...] = (
    ("id", _UUID),
    ("partition", SmallInteger()),
    ("target_id", _UUID),
    ("name", Text()),
    ("payload", Text()),
    ("priority", SmallInteger()),
    ("schedule_kind", Text()),
    ("cron", Text()),
    ("cron_source", Text()),
    ("timezone", Text()),
    ("every_s", Integer()),
    ("schedule_anchor_at", _TS),
    ("scheduled_for", _TS),
    # The first occurrence's jitter (run_at is scheduled_for plus this): 0 for all but a
    # jittered recurring job, so a batch sends it once.
    ("fire_delay_ms", Integer()),
    ("occurrence_id", _UUID),
    ("max_attempts", Integer()),
    ("backoff_base_s", Double()),
    ("backoff_max_s", Double()),
    ("backoff_factor", Double()),
    ("dedup_key", Text()),
    ("parent_job_id", _UUID),
    ("interval_mode", Text()),
    ("misfire_policy", Text()),
    ("misfire_grace_s", Double()),
    ("catch_up_limit", Integer()),
    ("overlap_policy", Text()),
    ("jitter_s", Integer()),
    ("start_at", _TS),
    ("end_at", _TS),
    ("max_runs", Integer()),
    # The job's own completion settings (NULL: its target's).
    ("completion", Text()),
    ("async_timeout_s", Integer()),
    ("heartbeat_timeout_s", Integer()),
    # A chained job's link (NULL each for any other: a batch sends them once).
    ("after_job_id", _UUID),
    ("after_on", Text()),
    ("payload_from", Text()),
    # Labels as JSON text, cast in SQL ('{}' for most: a batch sends it once).
    ("labels", Text()),
    # A recurring job's own health thresholds, and its callback targets (NULL each for most:
    # a batch sends them once).
    ("expect_success_within_s", Integer()),
    ("expect_max_consecutive_failures", Integer()),
    ("on_success_target_id", _UUID),
    ("on_failure_target_id", _UUID),
)

# What a create returns of the job it wrote: every column but an open async attempt's, which
# a new job never has (job_public reads them as absent), and which cost the server decoding
# on every create.
OPEN_ATTEMPT_COLUMNS = frozenset(
    {"async_deadline_at", "awaiting_since", "completion_token_hash", "last_heartbeat_at", "progress"}
    | {"progress_message", "pause_requested_at"}
)
CREATED_COLUMNS = tuple(column for column in jobs.c if column.name not in OPEN_ATTEMPT_COLUMNS)

# A one-off job's recurrence columns: the policies' defaults (the columns are NOT NULL).
_ONE_OFF_RECURRENCE: dict[str, Any] = {
    "interval_mode": Recurrence.interval_mode.value,
    "misfire_policy": Recurrence.misfire_policy.value,
    "misfire_grace_s": Recurrence.misfire_grace_s,
    "catch_up_limit": Recurrence.catch_up_limit,
    "overlap_policy": Recurrence.overlap_policy.value,
    "jitter_s": 0,
    "start_at": None,
    "end_at": None,
    "max_runs": None,
}


# Columns every row sets apart (new ids, and the hash of the id): always sent as arrays. Any
# other column whose value is the same in every row (a batch's one target, schedule kind,
# retry policy, the NULLs of a one-off's recurrence...) is sent once, as `<name>_fill`, with an
# empty array, which unnest() pads with NULLs: about half the arrays of a typical batch, and
# so half the driver's encoding and the server's decoding, go.
ALWAYS_ARRAYS = frozenset({"id", "partition", "occurrence_id"})


@dataclass(frozen=True)
class PreparedJob:
    """A job about to be inserted: its new id, and its payload as the JSON text stored
    (app/domain/payload.py: payload_json, or encode_within with the size limit)."""

    id: uuid.UUID
    new: NewJob
    payload: str

    @classmethod
    def of(cls, new: NewJob, payload: str, job_id: uuid.UUID | None = None) -> PreparedJob:
        return cls(job_id or new.id or new_id(), new, payload)


COLUMN_NAMES = tuple(name for name, _ in NEW_JOB_COLUMNS)
_SCHEDULE_COLUMNS = ("schedule_kind", "cron", "cron_source", "timezone", "every_s")
_POLICY_COLUMNS = ("max_attempts", "backoff_base_s", "backoff_max_s", "backoff_factor")
_RECURRENCE_COLUMNS = tuple(_ONE_OFF_RECURRENCE)
# _values' order, checked against the arrays' once.
assert COLUMN_NAMES == (
    *("id", "partition", "target_id", "name", "payload", "priority"),
    *_SCHEDULE_COLUMNS,
    *("schedule_anchor_at", "scheduled_for", "fire_delay_ms", "occurrence_id"),
    *_POLICY_COLUMNS,
    *("dedup_key", "parent_job_id"),
    *_RECURRENCE_COLUMNS,
    *("completion", "async_timeout_s", "heartbeat_timeout_s"),
    *("after_job_id", "after_on", "payload_from"),
    "labels",
    *("expect_success_within_s", "expect_max_consecutive_failures", "on_success_target_id", "on_failure_target_id"),
)
_schedule_in_order = operator.itemgetter(*_SCHEDULE_COLUMNS)
_policy_in_order = operator.itemgetter(*_POLICY_COLUMNS)
_recurrence_in_order = operator.itemgetter(*_RECURRENCE_COLUMNS)
_ONCE = _schedule_in_order(schedule_columns(OnceSchedule(EARLIEST_RUN_AT)))
_ONE_OFF = _recurrence_in_order(_ONE_OFF_RECURRENCE)
# A job that sets no completion settings of its own: its target's apply.
_INHERITED = (None, None, None)
_UNCHAINED = (None, None, None)
_NO_LABELS = "{}"
# A job with no thresholds of its own, and no callbacks.
_NO_EXPECT = (None, None)
_NO_CALLBACKS = (None, None)
# A chained job's schedule columns: no fire time of its own.
_AFTER = (ScheduleKind.AFTER, None, None, "UTC", None)


@lru_cache(maxsize=1024)
def _schedule_values(schedule: Schedule) -> tuple[Any, ...]:
    return _schedule_in_order(schedule_columns(schedule))  # type: ignore[no-any-return]


@lru_cache(maxsize=1024)
def _policy_values(policy: RetryPolicy) -> tuple[Any, ...]:
    return _policy_in_order(policy_columns(policy))  # type: ignore[no-any-return]


def job_values(prepared: PreparedJob, occurrence_id: uuid.UUID) -> tuple[Any, ...]:
    """The job's columns, in NEW_JOB_COLUMNS' order: a tuple, and the parts that jobs share (a one-off's
    schedule columns, a retry policy) built once, since a batch makes one per job."""
    new = prepared.new
    schedule = new.schedule
    recurrence = new.recurrence
    completion = new.completion
    after = new.after
    return (
        prepared.id,
        partition_for(prepared.id),
        new.target_id,
        new.name,
        prepared.payload,
        new.priority,
        *(_AFTER if after is not None else _ONCE if isinstance(schedule, OnceSchedule) else _schedule_values(schedule)),
        new.anchor_at or new.first_fire_at,
        new.first_fire_at,
        # run_at is scheduled_for plus this: NULL, no fire time, for a chained job.
        None
        if after is not None
        else 0
        if recurrence is None or not recurrence.jitter_s
        else _fire_delay_ms(prepared.id, new.first_fire_at, recurrence),
        occurrence_id,
        *_policy_values(new.policy),
        new.dedup_key,
        new.parent_job_id,
        *(_ONE_OFF if recurrence is None else _recurrence_in_order(recurrence_columns(recurrence))),
        *(
            _INHERITED
            if completion is None
            else (completion.mode, completion.async_timeout_s, completion.heartbeat_timeout_s)
        ),
        *(_UNCHAINED if after is None else (after.parent_id, after.on.value, after.payload_from)),
        _NO_LABELS if not new.labels else json.dumps(new.labels, sort_keys=True, separators=(",", ":")),
        *(_NO_EXPECT if new.expect is None else (new.expect.success_within_s, new.expect.max_consecutive_failures)),
        *(
            _NO_CALLBACKS
            if new.on_success_target_id is None and new.on_failure_target_id is None
            else (new.on_success_target_id, new.on_failure_target_id)
        ),
    )


def _fire_delay_ms(job_id: uuid.UUID, fire_at: dt.datetime, recurrence: Recurrence) -> int:
    return jitter_delay(job_id, fire_at, recurrence.jitter_s) // dt.timedelta(milliseconds=1)


def job_arrays(tenant_id: uuid.UUID, jobs_: Sequence[PreparedJob]) -> dict[str, Any]:
    """One array per column, in the order of `jobs_` (rows transposed by zip, in C: a batch
    of 1,000 jobs is 27 arrays, not 27,000 appends); a column with one value in every row is
    that value (`<name>_fill`) and an empty array."""
    rows = [job_values(job, occurrence) for job, occurrence in zip(jobs_, new_ids(len(jobs_)), strict=True)]
    columns = zip(*rows, strict=True) if rows else (() for _ in COLUMN_NAMES)
    parameters: dict[str, Any] = {"tenant_id": tenant_id}
    for name, values in zip(COLUMN_NAMES, columns, strict=True):
        if name not in ALWAYS_ARRAYS:
            # tuple.count compares in C. Equal across types (1 == 1.0) cannot happen within a
            # column: each is built from one type.
            uniform = bool(values) and values.count(values[0]) == len(values)
            parameters[f"{name}_fill"] = values[0] if uniform else None
            if uniform:
                parameters[name] = []
                continue
        parameters[name] = list(values)
    return parameters
