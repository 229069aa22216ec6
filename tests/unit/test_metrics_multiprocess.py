"""With PROMETHEUS_MULTIPROC_DIR, /metrics of any process serves the sum over all of them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from app.metrics import sample_value

RECORD = """
import datetime as dt, uuid
from app import metrics
metrics.RETRIES_SCHEDULED.inc()
metrics.backlog_observed("replica-{n}", 4, 2, None, 1, dt.datetime.now(dt.UTC))
"""
SCRAPE = "import sys; from app.metrics import exposition; sys.stdout.write(exposition()[0].decode())"


def _run(code: str, multiproc_dir: Path) -> str:
    env = {"PROMETHEUS_MULTIPROC_DIR": str(multiproc_dir), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout


def test_counters_add_up_across_processes(tmp_path: Path) -> None:
    for n in (1, 2):
        _run(RECORD.format(n=n), tmp_path)
    text = _run(SCRAPE, tmp_path)
    assert sample_value(text, "cronhook_retries_scheduled_total") == 2
    # Gauges are per process ("liveall"): both replicas' partitions are there, each once.
    assert sample_value(text, "cronhook_partitions_owned", {"replica": "replica-1"}) == 4
    assert sample_value(text, "cronhook_partitions_owned") == 8


def test_a_batch_of_observations_reads_as_the_same_observations_one_by_one() -> None:
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from app.metrics import observe_many

    values = [0.0, 0.004, 0.005, 0.0051, 0.3, 1.0, 7.5, 59.9, 61.0, 3600.0, 0.005]
    exposed = []
    for record in (lambda h: [h.observe(v) for v in values], lambda h: observe_many(h, values)):
        registry = CollectorRegistry()
        histogram = Histogram("h_seconds", "h", buckets=(0.005, 0.01, 1, 60), registry=registry)
        record(histogram)
        exposed.append(generate_latest(registry).decode())
    assert exposed[0] == exposed[1]
    assert 'h_seconds_bucket{le="0.005"} 4.0' in exposed[1] and "h_seconds_count 11.0" in exposed[1]


async def test_deliveries_reach_the_metrics_within_the_loop_pass_that_recorded_them() -> None:
    import asyncio
    import datetime as dt
    import uuid

    from app import metrics
    from app.domain.job import AttemptOutcome, RunOutcome

    class Job:
        id = target_id = uuid.uuid4()
        attempt = 1
        scheduled_for = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)

    def delivered() -> float:
        text = metrics.exposition()[0].decode()
        return sample_value(text, "cronhook_deliveries_total", {"outcome": "success", "status_class": "2xx"}) or 0.0

    before = delivered()
    result = AttemptOutcome(RunOutcome.SUCCESS, 200, None, 12, Job.scheduled_for + dt.timedelta(seconds=2))
    for _ in range(3):
        # A stand-in holding only the fields delivery_recorded reads, not a ClaimedJob.
        metrics.delivery_recorded(Job(), result, retrying=False, dead_letter=False)  # type: ignore[arg-type]
    assert delivered() == before  # added up, not yet applied
    await asyncio.sleep(0)
    assert delivered() == before + 3
