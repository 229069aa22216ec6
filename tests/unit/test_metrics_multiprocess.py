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
