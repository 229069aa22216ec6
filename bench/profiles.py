"""py-spy profiles of the cronhook processes a bench runs (`--profile DIR`), ranked: the
functions most on CPU by self and inclusive samples, and self samples grouped by library.

    .venv/bin/python bench/profiles.py DIR/*.txt     # rank raw files recorded earlier
"""

from __future__ import annotations

import collections
import contextlib
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from processes import BIN, stop_process


class Profiler:
    """py-spy record (raw collapsed stacks, 100 Hz, child processes too) on one process tree."""

    def __init__(self, out_dir: Path, name: str, pid: int) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self.path = out_dir / f"{name}.txt"
        self.log = out_dir / f"{name}.log"
        py_spy = BIN / "py-spy"
        if not py_spy.exists():
            raise SystemExit(f"--profile needs py-spy in this venv: {BIN / 'pip'} install py-spy")
        argv = [str(py_spy), "record", "--pid", str(pid), "--format", "raw", "--rate", "100"]
        argv += ["--subprocesses", "--full-filenames", "--output", str(self.path)]
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)

    def stop(self) -> dict[str, Any]:
        """Ends the recording (SIGINT makes py-spy write its file) and ranks the samples."""
        stop_process(self.proc, signal.SIGINT, 30)
        if not self.path.exists():
            return {"error": self.log.read_text(errors="replace")[-300:]}
        return {"file": str(self.path), **rank_profile(self.path.read_text(errors="replace"))}


@contextlib.contextmanager
def profiled(out_dir: str | None, name: str, pid: int) -> Iterator[dict[str, Any]]:
    """py-spy on `pid`'s process tree for the with-block when `out_dir` is set (a bench's
    `--profile`): the ranking lands in the dict it yields, which stays empty otherwise."""
    ranking: dict[str, Any] = {}
    if out_dir is None:
        yield ranking
        return
    profiler = Profiler(Path(out_dir), name, pid)
    try:
        yield ranking
    finally:
        ranking.update(profiler.stop())


REPO = Path(__file__).resolve().parent.parent

# Where a leaf frame's code lives, by path fragment: the first match names its share.
_AREAS = [
    ("cronhook app/", str(REPO / "app") + "/"),
    ("sqlalchemy", "sqlalchemy/"),
    ("asyncpg", "asyncpg/"),
    ("aiohttp", "aiohttp/"),
    ("fastapi/starlette", "fastapi/"),
    ("fastapi/starlette", "starlette/"),
    ("pydantic", "pydantic"),
    ("uvicorn/h11", "uvicorn/"),
    ("uvicorn/h11", "h11/"),
    ("asyncio", "asyncio/"),
    ("asyncio", "/selectors.py"),
    ("threading", "/threading.py"),
    ("json", "json/"),
    ("logging", "logging/"),
]


def _frame_key(frame: str) -> str:
    """'name (path/to/file.py:123)' -> 'name (file.py)': samples of one function add up."""
    name, _, where = frame.partition(" (")
    path = where.rsplit(":", 1)[0]
    for marker in ("site-packages/", "/lib/python3.11/", str(REPO) + "/"):
        if marker in path:
            return f"{name} ({path.split(marker, 1)[1]})"
    return f"{name} ({'/'.join(path.split('/')[-2:])})"


# Leaf frames of threads that are waiting, not running (py-spy's idle detection misses them
# here): idle thread-pool workers, the event loop's poll for I/O, and a child's watch of its
# parent's pipe (a blocking read, app/processes.py).
IDLE_LEAVES = (
    "Condition.wait",
    "EpollSelector.select",
    "Event.wait",
    "Thread._wait_for_tstate_lock",
    "_watch_pipe",
)


def _area(frame: str) -> str:
    return next((area for area, fragment in _AREAS if fragment in frame), "other")


def rank_profile(raw: str, top: int = 15) -> dict[str, Any]:
    """From py-spy's collapsed stacks: the functions most on CPU by self samples (leaf frame),
    by inclusive samples (anywhere on the stack), and self samples grouped by library; samples
    of waiting threads (IDLE_LEAVES) are counted apart and left out of the percentages."""
    self_counts: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    areas: collections.Counter[str] = collections.Counter()
    total = idle = 0
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        # The first frame names the process (with --subprocesses) or thread: not code.
        frames = [f for f in stack.split(";") if " (" in f and not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        if frames[-1].startswith(IDLE_LEAVES):
            idle += count
            continue
        total += count
        self_counts[_frame_key(frames[-1])] += count
        areas[_area(frames[-1])] += count
        for key in {_frame_key(f) for f in frames}:
            inclusive[key] += count

    def pct(counter: collections.Counter[str], n: int) -> list[tuple[str, float]]:
        return [(key, round(100 * c / total, 1)) for key, c in counter.most_common(n)] if total else []

    return {
        "samples": total,
        "idle_samples_left_out": idle,
        "self_pct": pct(self_counts, top),
        "inclusive_pct": pct(inclusive, 3 * top),
        "area_self_pct": pct(areas, len(areas)),
    }


def brief(profile: dict[str, Any]) -> dict[str, Any]:
    """A ranking for a bench's JSON line: without the long inclusive list."""
    return {key: value for key, value in profile.items() if key != "inclusive_pct"}


def print_profile(title: str, profile: dict[str, Any], top: int = 10) -> None:
    if "samples" not in profile:
        print(f"{title}: no profile ({profile.get('error')})")
        return
    print(f"{title}: {profile['samples']} samples")
    print("  by library (self): " + ", ".join(f"{a} {p}%" for a, p in profile["area_self_pct"]))
    print("  self:      " + "; ".join(f"{k} {p}%" for k, p in profile["self_pct"][:top]))
    app_inclusive = [(k, p) for k, p in profile["inclusive_pct"] if "(app/" in k]
    print("  inclusive (app): " + "; ".join(f"{k} {p}%" for k, p in app_inclusive[:top]))


if __name__ == "__main__":
    for name in sys.argv[1:]:
        print_profile(name, rank_profile(Path(name).read_text(errors="replace")), top=15)
