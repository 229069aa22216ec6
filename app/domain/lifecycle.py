"""What happens to a job after an attempt: the pure decision, applied by app/store/outcomes.py.

Used by the scheduler (an attempt returned) and the reaper (a lease expired, which counts as
a failed attempt). Keeping one function means both paths agree on retries and dead letters.
"""

from __future__ import annotations

import datetime as dt
import random
from dataclasses import dataclass

from app.domain.fire_times import NO_SKIPS, Skipped
from app.domain.occurrences import EndReason, Recurrence, next_after_run
from app.domain.retry import RetryPolicy, attempts_exhausted, backoff_delay
from app.domain.states import JobState


@dataclass(frozen=True)
class AttemptContext:
    scheduled_for: dt.datetime
    attempt: int  # the attempt just made, 1-based
    policy: RetryPolicy
    # Recurring jobs: bounds, interval mode, misfire and overlap policies; None for one-offs.
    recurrence: Recurrence | None = None
    # Occurrences delivered before this one.
    runs_done: int = 0
    # When this occurrence's first attempt was claimed, kept across its retries (fire times
    # due by then are a backlog, not overlaps); None when not known.
    first_claimed_at: dt.datetime | None = None


@dataclass(frozen=True)
class NextStep:
    state: JobState
    # Absolute fire time of the next occurrence (recurring jobs), or None.
    next_occurrence_at: dt.datetime | None = None
    # Seconds from the database's now() until the retry (state retrying), or None.
    retry_delay_s: float | None = None
    # The failed occurrence goes to the dead-letter queue.
    dead_letter: bool = False
    # Why a recurring job ended: "max_runs", "end_at" or "schedule" (no fire time left).
    ended_reason: EndReason | None = None
    # Fire times dropped because they came due while this occurrence was in flight.
    overlapped: Skipped = NO_SKIPS

    @property
    def schedule_ended(self) -> bool:
        """A recurring job reached its bounds, or its schedule has no fire time left."""
        return self.ended_reason is not None


def after_attempt(
    ctx: AttemptContext,
    succeeded: bool,
    now: dt.datetime,
    rng: random.Random,
    *,
    retryable: bool = True,
    retry_after_s: float | None = None,
) -> NextStep:
    """`retryable=False` (a 404, say) dead-letters at once; `retry_after_s` (the receiver's
    Retry-After, already capped) lengthens the backoff, never shortens it."""
    if not succeeded and retryable and not attempts_exhausted(ctx.policy, ctx.attempt):
        delay = backoff_delay(ctx.policy, ctx.attempt, rng)
        if retry_after_s is not None:
            delay = max(delay, retry_after_s)
        return NextStep(JobState.RETRYING, retry_delay_s=delay)
    dead_letter = not succeeded
    # A recurring job keeps its schedule after a failed occurrence (as Cloud Scheduler does):
    # the occurrence is dead-lettered and the next one is scheduled.
    if ctx.recurrence is None:  # a one-off: nothing follows
        next_at, ended_reason, overlapped = None, None, NO_SKIPS
    else:
        following = next_after_run(
            ctx.recurrence, ctx.scheduled_for, now, ctx.runs_done + 1, claimed_at=ctx.first_claimed_at
        )
        next_at, ended_reason, overlapped = following.next_at, following.ended, following.overlapped
    if next_at is not None:
        return NextStep(JobState.SCHEDULED, next_occurrence_at=next_at, dead_letter=dead_letter, overlapped=overlapped)
    # A recurring job past its bounds ends succeeded (with its reason) even when its last
    # occurrence was dead-lettered: only a one-off job ends dead.
    return NextStep(
        JobState.DEAD if dead_letter and ctx.recurrence is None else JobState.SUCCEEDED,
        dead_letter=dead_letter,
        ended_reason=ended_reason,
        overlapped=overlapped,
    )
