"""The job state machine: one enum and the table of allowed transitions.

Every UPDATE that changes a job's state names the states it expects in its WHERE clause
(app/store/jobs.py, claim_statements.py, lease_writes.py, outcomes.py). This table is the reference those statements
follow: tests/unit/test_state_changes.py checks each of them against it.
"""

from __future__ import annotations

import enum


class JobState(enum.StrEnum):
    # Waiting for its fire time. The scheduler claims it (-> running); cancel ends it.
    SCHEDULED = "scheduled"
    # Leased by one scheduler with a delivery in flight. The scheduler that holds the lease
    # records the outcome; the reaper rescues it when the lease expires.
    RUNNING = "running"
    # The last attempt failed; waiting for its backoff. The scheduler claims it again; a PATCH
    # of its schedule starts a new occurrence instead (-> scheduled).
    RETRYING = "retrying"
    # Stopped by the user (pause) until resumed; nothing is claimed meanwhile.
    PAUSED = "paused"
    # Terminal: a one-off job was delivered (2xx), or a recurring one reached its bounds.
    SUCCEEDED = "succeeded"
    # Terminal: a one-off job exhausted its attempts; a dead letter keeps the last outcome.
    DEAD = "dead"
    # Terminal: cancelled by the user.
    CANCELLED = "cancelled"


TERMINAL_STATES: frozenset[JobState] = frozenset({JobState.SUCCEEDED, JobState.DEAD, JobState.CANCELLED})

# Jobs in these states are waiting for `run_at` and may be claimed once it has passed.
CLAIMABLE_STATES: tuple[JobState, ...] = (JobState.SCHEDULED, JobState.RETRYING)

TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.SCHEDULED: frozenset({JobState.RUNNING, JobState.PAUSED, JobState.CANCELLED}),
    JobState.RUNNING: frozenset(
        {
            JobState.SUCCEEDED,  # one-off delivered
            JobState.SCHEDULED,  # recurring: next occurrence
            JobState.RETRYING,  # failed attempt, or lease expired, with attempts left
            JobState.DEAD,  # one-off out of attempts
            JobState.CANCELLED,
            JobState.PAUSED,  # quarantined: the claim could not load the row (last_error says why)
        }
    ),
    JobState.RETRYING: frozenset(
        {
            JobState.RUNNING,
            JobState.PAUSED,
            JobState.CANCELLED,
            JobState.SCHEDULED,  # PATCH of the schedule or bounds: a new occurrence, no attempts made
        }
    ),
    # Resume: misfired fire times are settled by the misfire policy when the job is claimed.
    JobState.PAUSED: frozenset({JobState.SCHEDULED, JobState.RETRYING, JobState.CANCELLED}),
    JobState.SUCCEEDED: frozenset(),
    JobState.DEAD: frozenset(),
    JobState.CANCELLED: frozenset(),
}

# States a user may cancel from. A running job may be cancelled: its in-flight POST can
# still land, but its outcome is then fenced off and the job stays cancelled.
CANCELLABLE_STATES: tuple[JobState, ...] = (JobState.SCHEDULED, JobState.RETRYING, JobState.RUNNING, JobState.PAUSED)

# States a user may pause from. A running job finishes its occurrence first (409 meanwhile).
PAUSABLE_STATES: tuple[JobState, ...] = (JobState.SCHEDULED, JobState.RETRYING)

# States a user may change a job in (PATCH): it is waiting. A running job finishes its
# occurrence first (409 meanwhile).
CHANGEABLE_STATES: tuple[JobState, ...] = (JobState.SCHEDULED, JobState.RETRYING, JobState.PAUSED)
