"""Every bench once with a tiny N, so that a rename that breaks one fails CI (`make bench-smoke`).

Each bench script runs as `python bench/<name>.py --smoke` (its own tiny defaults) in a process
group of its own, one after another, with a deadline each. It passes when it exits 0 and its
last line of output is a JSON object, and when it leaves no process behind: this process is a
child subreaper, so whatever a bench starts and does not stop (a cronhook process, a receiver,
a PostgreSQL server) is reparented here, reported and stopped. A bench script in bench/ that
is not listed below fails the smoke, so a new bench cannot be forgotten.

The benches that take `--database-url` share one embedded PostgreSQL, started here the way a
bench starts its own (harness.BenchDatabase), and each creates and drops a database of its own
on it: starting a server is most of a tiny run's set-up. A bench whose tools this machine
lacks (the peers' folder, PostgreSQL 15's server binaries, cronsim) is skipped with the reason.

    .venv/bin/python bench/smoke.py                 # all of them
    .venv/bin/python bench/smoke.py soak cluster    # some
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import importlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
# The kit itself, not benches.
KIT = {"harness", "processes", "receiver", "workload", "profiles", "smoke"}
# What each bench needs beyond the venv: "peers" (../shared/peers and their venvs), "pg15" (the
# machine's PostgreSQL 15 server binaries), "cronsim" (the `bench` extra), "database" (takes
# --database-url: the shared server).
NEEDS: dict[str, set[str]] = {
    "dispatch": {"database"},
    "cluster": {"database"},
    "claim_cost": {"database"},
    "create_parts": {"database"},
    "quota_scale": {"database"},
    "retention": {"database"},
    "fairness": {"database"},
    "list_memory": {"database"},
    "footprint": {"database"},
    "soak": {"database"},
    "lateness": {"database", "peers"},
    "chains": {"database", "peers"},
    "schedule_sets": {"database"},
    "health": {"database"},
    "drain": {"database"},
    "scale": {"database", "peers"},
    "compare": {"peers"},
    "api_compare": {"peers"},
    "async_completion": {"peers"},
    "db_drill": {"pg15"},
    "cron_compare": {"cronsim"},
}
DEADLINE_S = 60.0
TERM_GRACE_S = 20.0
LEFTOVER_GRACE_S = 3.0


@dataclass
class Outcome:
    status: str  # "ok", "failed", "skipped"
    seconds: float = 0.0
    reason: str = ""

    def __post_init__(self) -> None:
        self.seconds = round(self.seconds, 1)


def become_subreaper() -> bool:
    """Orphans of the benches are reparented to this process (Linux), so leftovers show."""
    try:
        return bool(ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def reap() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def leftovers(keep: set[int]) -> list[psutil.Process]:
    """Processes still under this one, but `keep` and their descendants, once they had a
    moment to exit."""
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    while True:
        reap()
        kept = set(keep)
        for pid in keep:
            with contextlib.suppress(psutil.Error):
                kept.update(child.pid for child in psutil.Process(pid).children(recursive=True))
        found = []
        for proc in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if proc.pid not in kept and proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc)
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def stop_all(procs: list[psutil.Process]) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=10)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=5)
    reap()


@contextlib.contextmanager
def shared_postgres(wanted: bool) -> Iterator[tuple[str | None, set[int]]]:
    """One embedded PostgreSQL for the benches that take --database-url, started as a bench
    starts its own (harness.BenchDatabase), so that path is covered too: (its URL, {its
    postmaster's pid}). (None, {}) when not `wanted` or when it cannot start: each bench then
    starts its own (and reports why it cannot)."""
    if not wanted:
        yield None, set()
        return
    try:
        sys.path.insert(0, str(BENCH))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs, when XDG_RUNTIME_DIR is unset
            from harness import BenchDatabase

        database = BenchDatabase(None)
        url = asyncio.run(database.start())
    except Exception as exc:
        print(f"no shared PostgreSQL ({type(exc).__name__}: {exc}); each bench starts its own")
        yield None, set()
        return
    try:
        postmaster = database.postmaster_pid()
        yield url, set() if postmaster is None else {postmaster}
    finally:
        asyncio.run(database.stop())
        reap()


def peers_ready() -> str:
    """'' when the peers' folder and their venvs are there (built once, cached), else why not."""
    candidates = [Path(os.environ["CRONHOOK_PEERS_DIR"])] if os.environ.get("CRONHOOK_PEERS_DIR") else []
    candidates += [parent / "shared" / "peers" for parent in REPO.parents]
    found = next((path for path in candidates if (path / "side_by_side.py").exists()), None)
    if found is None:
        return "the peers' folder (shared/peers) is not there; set CRONHOOK_PEERS_DIR"
    sys.path.insert(0, str(found))
    try:
        started = time.monotonic()
        importlib.import_module("env").ensure_peers_venv()
        importlib.import_module("api_env").ensure_api_venv()
        print(f"peers' venvs ready in {time.monotonic() - started:.1f} s")
    except Exception as exc:
        return f"the peers' venvs could not be built: {exc}"
    return ""


def missing(needs: set[str], peers_problem: str) -> str:
    """Why this machine cannot run a bench with these needs ('' when it can)."""
    if "peers" in needs and peers_problem:
        return peers_problem
    if "pg15" in needs:
        pg_bin = Path(os.environ.get("CRONHOOK_PG_BIN", "/usr/lib/postgresql/15/bin"))
        if not (pg_bin / "postgres").exists():
            return f"PostgreSQL 15 server binaries not in {pg_bin} (apt-get install postgresql-15, or CRONHOOK_PG_BIN)"
    if "cronsim" in needs and importlib.util.find_spec("cronsim") is None:
        return "cronsim is not installed: .venv/bin/pip install -e '.[bench]'"
    return ""


def last_json(path: Path) -> dict[str, Any] | None:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    if not lines:
        return None
    try:
        value = json.loads(lines[-1])
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def run_one(name: str, database_url: str | None, workdir: Path, keep: set[int], deadline_s: float) -> Outcome:
    argv = [sys.executable, str(BENCH / f"{name}.py"), "--smoke"]
    if database_url is not None and "database" in NEEDS[name]:
        argv += ["--database-url", database_url]
    # Nothing of the caller's cronhook set-up leaks in (a database URL, keys), but where the
    # peers and the PostgreSQL 15 binaries are.
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRONHOOK_")}
    env.update({k: v for k, v in os.environ.items() if k in ("CRONHOOK_PEERS_DIR", "CRONHOOK_PG_BIN")})
    log = workdir / f"{name}.log"
    started = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=REPO)
        try:
            code = proc.wait(deadline_s)
            problem = "" if code == 0 else f"exit code {code}"
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)  # the bench's finally blocks stop what it started
            try:
                proc.wait(TERM_GRACE_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
            problem = f"ran past its {deadline_s:g} s"
    seconds = time.monotonic() - started
    if not problem and last_json(log) is None:
        problem = "its last line is not a JSON object"
    left = leftovers(keep)
    if left:
        names = ", ".join(f"{p.pid} {' '.join(p.cmdline()[:3])}"[:80] for p in left)
        problem = "; ".join(filter(None, [problem, f"left {len(left)} process(es) running: {names}"]))
        stop_all(left)
    if problem:
        print(f"--- {name}: the end of its output ({log})")
        print("\n".join(log.read_text(errors="replace").splitlines()[-25:]))
        return Outcome("failed", seconds, problem)
    return Outcome("ok", seconds)


def benches() -> list[str]:
    scripts = sorted(path.stem for path in BENCH.glob("*.py") if path.stem not in KIT)
    unlisted = [name for name in scripts if name not in NEEDS]
    if unlisted:
        raise SystemExit(f"bench/smoke.py does not know {', '.join(unlisted)}: add it to NEEDS")
    return [name for name in NEEDS if name in scripts]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="benches to run (default: all)")
    parser.add_argument("--deadline", type=float, default=DEADLINE_S, help=f"seconds per bench ({DEADLINE_S:g})")
    args = parser.parse_args(argv)
    names = args.names or benches()
    unknown = [name for name in names if name not in NEEDS]
    if unknown:
        parser.error(f"unknown bench {', '.join(unknown)}; known: {', '.join(NEEDS)}")
    started = time.monotonic()
    become_subreaper()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    outcomes: dict[str, Outcome] = {}
    peers_problem = peers_ready() if any("peers" in NEEDS[name] for name in names) else ""
    with tempfile.TemporaryDirectory(prefix="cronhook-smoke-") as tmp:
        workdir = Path(tmp)
        wants_database = any("database" in NEEDS[name] for name in names)
        with shared_postgres(wants_database) as (database_url, keep):
            for name in names:
                reason = missing(NEEDS[name], peers_problem)
                outcome = Outcome("skipped", reason=reason) if reason else None
                if outcome is None:
                    outcome = run_one(name, database_url, workdir, keep, args.deadline)
                outcomes[name] = outcome
                print(f"{outcome.status:>7}  {name:<13} {outcome.seconds:5.1f} s  {outcome.reason}", flush=True)
    total = time.monotonic() - started
    failed = [name for name, outcome in outcomes.items() if outcome.status == "failed"]
    skipped = [name for name, outcome in outcomes.items() if outcome.status == "skipped"]
    ok = len(outcomes) - len(failed) - len(skipped)
    print(f"bench smoke: {ok} passed, {len(failed)} failed, {len(skipped)} skipped in {total:.1f} s")
    print(json.dumps({"total_s": round(total, 1), "benches": {n: asdict(o) for n, o in outcomes.items()}}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
