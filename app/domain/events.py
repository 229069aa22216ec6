"""Events: what cronhook tells a tenant's subscribed targets about its schedules, targets
and checks. Pure definitions; the events are written by app/store/events.py (and, for
settled occurrences and auto-pauses, by the outcome statement, app/store/outcomes.py).

An event is delivered as a one-off job to the subscribed target, so it is signed, retried
with backoff, rate-limited by the target's limits, visible in runs and replayable from the
dead-letter queue. Its webhook-id (the job's occurrence id, which is the event's id) is
stable across retries. An event is written in the same transaction as the change it
reports, so it is neither lost nor doubled by a crash; edge-triggered kinds (health,
pause, checks) are guarded by the state they flip, so each edge is reported once. An
event's own delivery is never the subject of another event (jobs.event_type is set).

Body (the job's payload): {"id", "type", "created_at", "tenant_id", "data": {...}}.
"""

from __future__ import annotations

import enum


class EventType(enum.StrEnum):
    OCCURRENCE_SUCCEEDED = "occurrence.succeeded"
    OCCURRENCE_DEAD_LETTERED = "occurrence.dead_lettered"
    JOB_HEALTH_FAILING = "job.health.failing"
    JOB_HEALTH_RECOVERED = "job.health.recovered"
    TARGET_PAUSED = "target.paused"
    TARGET_RESUMED = "target.resumed"
    TARGET_AUTO_PAUSED = "target.auto_paused"
    CHECK_DOWN = "check.down"
    CHECK_UP = "check.up"


# How an event's delivery is retried: about 36 minutes from the first attempt to the
# dead-letter queue (5, 10, 20 ... s, at most 900 s apart), where it can be replayed.
EVENT_MAX_ATTEMPTS = 10
EVENT_BACKOFF_BASE_S = 5.0
EVENT_BACKOFF_MAX_S = 900.0
EVENT_BACKOFF_FACTOR = 2.0

# The event an occurrence's settling emits: succeeded, or failed (dead-lettered).
SETTLED_EVENT = {"success": EventType.OCCURRENCE_SUCCEEDED, "failure": EventType.OCCURRENCE_DEAD_LETTERED}

MAX_SUBSCRIPTION_TYPES = len(EventType)
