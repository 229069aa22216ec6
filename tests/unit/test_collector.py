"""A long-running process settles its garbage collector once start-up is done
(app/runtime.py: settle_collector): what start-up made is frozen out of every collection, and
the young generation is collected at YOUNG_GC_THRESHOLD net allocations instead of Python's
700, which in a burst ran the collector ~50 times per 1,000 deliveries. Checked in a fresh
interpreter, so this process's collector is left as it is."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import gc, json
before = gc.get_threshold()
from app.runtime import YOUNG_GC_THRESHOLD, settle_collector
settle_collector()
print(json.dumps({"before": before, "after": gc.get_threshold(), "frozen": gc.get_freeze_count(),
                  "young": YOUNG_GC_THRESHOLD}))
"""


def test_settle_collector_freezes_start_up_and_raises_only_the_young_threshold() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=60)
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["young"] > seen["before"][0]
    assert seen["after"] == [seen["young"], *seen["before"][1:]]
    # The imports above (SQLAlchemy, the settings...) are in the permanent generation now.
    assert seen["frozen"] > 10_000
