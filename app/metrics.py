"""Prometheus metrics: every metric cronhook exports, the cheap calls the hot paths make, and
the exposition (GET /metrics on the API, and the scheduler's and reaper's metrics port).

Label values come from small closed sets (outcomes, status classes, route templates), never
from job or tenant ids. The delivery path uses children bound once at import, so recording a
delivery is a few additions.

Several processes (`--processes`, gunicorn-style workers): set PROMETHEUS_MULTIPROC_DIR to an
empty directory before the processes start; each writes its samples there and any of them
serves the sum. Gauges are then kept per live process (`pid` label).
"""

from __future__ import annotations

import asyncio
import bisect
import datetime as dt
import logging
import os
import time
from collections import Counter as Tally
from collections.abc import Mapping

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client import multiprocess as _multiprocess

from app.domain.health import Health
from app.domain.job import AttemptOutcome, ClaimedJob, RunOutcome
from app.logs import log_event

logger = logging.getLogger("app.delivery")
# `*_created` timestamps double the series and no dashboard here reads them.
disable_created_metrics()  # type: ignore[no-untyped-call]

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
STATUS_CLASSES = ("2xx", "3xx", "4xx", "5xx", "none")
_DELIVERY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_LATENESS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300, 900, 3600)

DELIVERIES = Counter(
    "cronhook_deliveries_total", "Delivery attempts by outcome and HTTP status class", ["outcome", "status_class"]
)
DELIVERY_SECONDS = Histogram(
    "cronhook_delivery_duration_seconds", "Time from the POST to its answer (or failure)", buckets=_DELIVERY_BUCKETS
)
LATENESS_SECONDS = Histogram(
    "cronhook_delivery_lateness_seconds",
    "First attempts: the POST's start minus the occurrence's nominal fire time",
    buckets=_LATENESS_BUCKETS,
)
RETRIES_SCHEDULED = Counter("cronhook_retries_scheduled_total", "Failed attempts that will be retried")
DEAD_LETTERS = Counter("cronhook_dead_letters_total", "Occurrences moved to the dead-letter queue", ["source"])
FENCED = Counter("cronhook_fenced_outcomes_total", "Outcomes not applied because the lease was lost meanwhile")
LEASES_REAPED = Counter("cronhook_leases_reaped_total", "Expired job leases rescued by the reaper")
PARTITIONS_OWNED = Gauge(
    "cronhook_partitions_owned", "Partitions this replica holds", ["replica"], multiprocess_mode="liveall"
)
DUE_BACKLOG = Gauge(
    "cronhook_due_backlog",
    "Due, unclaimed jobs in this replica's partitions (not counting those held back by target limits)",
    ["replica"],
    multiprocess_mode="liveall",
)
OLDEST_DUE_AGE = Gauge(
    "cronhook_oldest_due_age_seconds",
    "Age of the oldest due, unclaimed job in this replica's partitions (0 when none waits)",
    ["replica"],
    multiprocess_mode="liveall",
)
HELD_BACK = Gauge(
    "cronhook_due_held_back",
    "Due jobs in this replica's partitions whose target is at its max_in_flight or rate limit",
    ["replica"],
    multiprocess_mode="liveall",
)
DB_OLDEST_OPERATION = Gauge(
    "cronhook_db_oldest_operation_seconds",
    "Age of this process's oldest database operation in flight (0 when none): a stalled database shows here",
    ["role"],
    multiprocess_mode="livemax",
)
ASYNC_OPENED = Counter(
    "cronhook_async_attempts_opened_total", "Async deliveries answered 202: attempts left open for a report"
)
ASYNC_OPEN = Gauge(
    "cronhook_async_attempts_open",
    "Open async attempts awaiting their receiver's report (all tenants; sampled by the reaper)",
    multiprocess_mode="livemax",
)
ASYNC_REPORTS = Counter(
    "cronhook_async_reports_total", "Completion reports accepted, by outcome (succeeded, failed, retry)", ["outcome"]
)
ASYNC_COMPLETION_SECONDS = Histogram(
    "cronhook_async_completion_seconds",
    "Async attempts: from the delivery's start to the receiver's report",
    buckets=(0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600, 24 * 3600, 7 * 86400),
)
ASYNC_TIMEOUTS = Counter(
    "cronhook_async_timeouts_total", "Open async attempts failed by the reaper, by kind (async, heartbeat)", ["kind"]
)
JOBS_BY_HEALTH = Gauge(
    "cronhook_jobs_by_health",
    "Unfinished jobs (event deliveries aside) by the health they show: healthy, late, failing, paused, unknown "
    "(all tenants; sampled by the reaper's health watch)",
    ["health"],
    multiprocess_mode="livemax",
)
API_REQUESTS = Counter("cronhook_api_requests_total", "API requests", ["method", "route", "status"])
API_SECONDS = Histogram("cronhook_api_request_duration_seconds", "API request latency", ["method", "route"])

# Bound once: the delivery path never looks a label up.
_DELIVERY_CHILDREN = {(o.value, c): DELIVERIES.labels(o.value, c) for o in RunOutcome for c in STATUS_CLASSES}
_DEAD_LETTER_DELIVERY = DEAD_LETTERS.labels("delivery")
_DEAD_LETTER_REAPER = DEAD_LETTERS.labels("reaper")


def status_class(status: int | None) -> str:
    return f"{status // 100}xx" if status is not None and 200 <= status < 600 else "none"


class RateLimitedLog:
    """At most `per_s` lines a second; the first line after a quiet spell says how many were dropped."""

    def __init__(self, per_s: float) -> None:
        self.per_s = per_s
        self._window = 0
        self._count = 0
        self._dropped = 0

    def allow(self, now: float) -> tuple[bool, int]:
        second = int(now)
        if second != self._window:
            self._window, self._count = second, 0
        if self._count >= self.per_s:
            self._dropped += 1
            return False, 0
        self._count += 1
        dropped, self._dropped = self._dropped, 0
        return True, dropped


_delivery_log = RateLimitedLog(per_s=100)


def delivery_recorded(
    job: ClaimedJob, result: AttemptOutcome, *, retrying: bool, dead_letter: bool, fenced: bool = False
) -> None:
    """One finished attempt: counters, histograms and the (rate-limited) INFO delivery line.

    The counts reach the metrics once the deliveries recorded in this pass of the event loop
    are all in (`_tally`): every metric change is a lock, a pid check and a write to the
    multiprocess file, about 15 us a delivery when made one by one."""
    tally = _tally
    counts = tally.counts
    counts[_DELIVERY_CHILDREN[(result.outcome.value, status_class(result.status_code))]] += 1
    if result.duration_ms is not None:
        tally.durations.append(result.duration_ms / 1000)
    if job.attempt == 1 and result.started_at is not None:
        tally.lateness.append(max(0.0, (result.started_at - job.scheduled_for).total_seconds()))
    if fenced:
        counts[FENCED] += 1
    elif dead_letter:
        counts[_DEAD_LETTER_DELIVERY] += 1
    elif retrying:
        counts[RETRIES_SCHEDULED] += 1
    tally.flush_soon()
    allowed, dropped = _delivery_log.allow(time.monotonic())
    if allowed:
        log_event(
            logger,
            "delivery",
            job_id=str(job.id),
            target_id=str(job.target_id),
            attempt=job.attempt,
            outcome=result.outcome.value,
            status=result.status_code,
            duration_ms=result.duration_ms,
            **({"fenced": True} if fenced else {}),
            **({"lines_dropped": dropped} if dropped else {}),
        )


def observe_many(histogram: Histogram, values: list[float]) -> None:
    """`histogram.observe(v)` for each value, with one change per bucket touched. Uses the
    histogram's own fields, as observe() does (tests/unit/test_metrics_multiprocess.py holds
    the two to the same exposition)."""
    if not values:
        return
    histogram._sum.inc(sum(values))
    bounds = histogram._upper_bounds
    # observe() counts a value in the first bucket whose upper bound is >= it.
    for index, count in Tally(bisect.bisect_left(bounds, value) for value in values).items():
        histogram._buckets[index].inc(count)


class _DeliveryTally:
    """Metric changes of recorded deliveries, applied together at the end of the loop pass."""

    def __init__(self) -> None:
        self.counts: Tally[Counter] = Tally()
        self.durations: list[float] = []
        self.lateness: list[float] = []
        self._scheduled = False

    def flush_soon(self) -> None:
        if self._scheduled:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush()
            return
        self._scheduled = True
        loop.call_soon(self.flush)

    def flush(self) -> None:
        self._scheduled = False
        counts, self.counts = self.counts, Tally()
        durations, self.durations = self.durations, []
        lateness, self.lateness = self.lateness, []
        for counter, count in counts.items():
            counter.inc(count)
        observe_many(DELIVERY_SECONDS, durations)
        observe_many(LATENESS_SECONDS, lateness)


_tally = _DeliveryTally()


def leases_reaped(rescued: int, dead_lettered: int) -> None:
    LEASES_REAPED.inc(rescued + dead_lettered)
    if dead_lettered:
        _DEAD_LETTER_REAPER.inc(dead_lettered)


def backlog_observed(
    replica: str, partitions: int, due: int, oldest_due_at: dt.datetime | None, held_back: int, now: dt.datetime
) -> None:
    PARTITIONS_OWNED.labels(replica).set(partitions)
    DUE_BACKLOG.labels(replica).set(due)
    HELD_BACK.labels(replica).set(held_back)
    OLDEST_DUE_AGE.labels(replica).set(max(0.0, (now - oldest_due_at).total_seconds()) if oldest_due_at else 0.0)


class _Sampled:
    """When a gauge a reaper pass samples was last set (time.monotonic()): a sample that costs
    a scan is taken less often than the pass runs."""

    def __init__(self) -> None:
        self.at: float | None = None

    def due(self, every_s: float, now: float) -> bool:
        return self.at is None or now - self.at >= every_s


_jobs_by_health_sampled = _Sampled()


def jobs_by_health_due(every_s: float) -> bool:
    """Whether the jobs-by-health gauge was last sampled `every_s` ago or more (or never)."""
    return _jobs_by_health_sampled.due(every_s, time.monotonic())


def jobs_by_health(counts: Mapping[Health, int]) -> None:
    for health, count in counts.items():
        JOBS_BY_HEALTH.labels(health.value).set(count)
    _jobs_by_health_sampled.at = time.monotonic()


def db_oldest_operation(role: str, age_s: float) -> None:
    DB_OLDEST_OPERATION.labels(role).set(age_s)


def exposition() -> tuple[bytes, str]:
    """The text exposition of this process, or of every process sharing PROMETHEUS_MULTIPROC_DIR."""
    if os.environ.get(MULTIPROC_ENV):
        registry = CollectorRegistry()
        _multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST


def process_exited(pid: int) -> None:
    """Drops a dead worker's live gauges (call from the process that supervised it)."""
    if os.environ.get(MULTIPROC_ENV):
        _multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]


def sample_value(text: str, name: str, labels: dict[str, str] | None = None) -> float:
    """The value of one sample in an exposition (0 when absent): for tests and `cronhook health`."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in (labels or {}).items()):
                total += sample.value
    return total


def async_attempt_opened(job: ClaimedJob, result: AttemptOutcome, *, fenced: bool) -> None:
    if result.duration_ms is not None:
        DELIVERY_SECONDS.observe(result.duration_ms / 1000)
    if fenced:
        FENCED.inc()
    else:
        ASYNC_OPENED.inc()


def async_report(outcome: str, seconds: float | None) -> None:
    ASYNC_REPORTS.labels(outcome).inc()
    if seconds is not None:
        ASYNC_COMPLETION_SECONDS.observe(max(0.0, seconds))


def async_timeouts(async_timeouts: int, heartbeat_timeouts: int) -> None:
    if async_timeouts:
        ASYNC_TIMEOUTS.labels("async").inc(async_timeouts)
    if heartbeat_timeouts:
        ASYNC_TIMEOUTS.labels("heartbeat").inc(heartbeat_timeouts)
