"""Asynchronous completion at scale: `--jobs` (10,000) one-off jobs of an `async` target, all
accepted (202) and open at once, heartbeating every `--heartbeat-every-s` (10 s) while they
are completed over `--hold-s` (60 s); the API's completion throughput against the peers' API
ceiling (../shared/peers/api_ceiling.py) in the same run; and compare.py's burst and
api_compare.py's single creates against their yardsticks, also in the same run.

One embedded PostgreSQL (the peers' pg.py), a fresh database per system. cronhook runs as
`--cronhook-cmd` (the API, default `cronhook api`), `--scheduler-cmd` (`cronhook scheduler`,
one process: its RSS is the scheduler's) and `cronhook reaper` (it would fail attempts whose
heartbeats lapsed), with CRONHOOK_PUBLIC_URL the API's address. The receiver is this file's
child process (`--child receiver`, aiohttp): it answers 202 to every delivery carrying a
`cronhook-completion-url` and keeps the URL, 200 to any other. The reports are sent by
another child (`--child client`, aiohttp on uvloop, K keep-alive connections), which also
drives the ceiling, so both sides of the ratio see the same client.

Phases, in order:
1. **ceiling**: the API ceiling, `--warmup` then `--requests` `POST /v1/jobs` at `--connections`;
2. **probe before**: `--probe-jobs` sync jobs due at one instant: the claim rate on an idle
   table (requests / (last arrival - due));
3. **open**: the N async jobs, created through `POST /v1/jobs/batch` before they fall due at
   one instant; from the due instant until every one is open in the database (running, lease
   owner `~async`): seconds, opens/s, the delivery rate at the receiver, scheduler CPU;
4. **probe while open**: the probe burst again, with the N attempts open;
5. **hold**: for `--hold-s`, every open attempt is sent a heartbeat (`{"progress": n}`) every
   `--heartbeat-every-s` (`--heartbeat-connections` in flight), while N - (--warmup +
   --requests) of them are completed (`{"outcome": "succeeded", "result": {...}}`) at an even
   pace over the phase. A round that takes longer than the interval is late;
6. **focus**: the rest, `--warmup` then `--requests` completions as fast as `--connections`
   allow: completions/s, p50/p99, CPU ms per completion of the API and of PostgreSQL, and
   the table statistics' rows and scans per completion;
7. **ceiling again** (unless --no-bracket); the ratio is against the mean of the ceiling runs;
8. **burst and single creates** (unless --no-peer-ratios): compare.py's and api_compare.py's own
   code, at `--burst-jobs` against the ceiling pipeline (`--burst-systems`) and with
   api_compare's defaults.

The scheduler's RSS: before the open phase, the most seen while the attempts are open (sampled
every 0.5 s), and after the last completion. Exit 1 when an attempt was not opened, a report
was refused (anything but 204, or a 409 of a heartbeat racing its own completion), a job did
not end succeeded with its result on its run, or a job was delivered twice.

    .venv/bin/python bench/async_completion.py                       # 10,000 jobs, ~5 minutes
    .venv/bin/python bench/async_completion.py --jobs 2000 --hold-s 20 --no-peer-ratios
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import resource
import secrets
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import api_compare
import compare
from aiohttp import web
from harness import (
    BATCH_PATH,
    Service,
    add_service_args,
    add_yardstick_args,
    batch_body,
    create_jobs_batch,
    load_peer,
    migrated_engine,
    parse_args,
    parse_env,
    percentile,
    positive_int,
    print_result,
    rfc3339,
    run_bench,
    tree_cpu_s,
    wait_partitions_owned,
)
from profiles import brief, profiled
from receiver import listening
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

DAY_S = 86_400.0
CONTROL = "/__async"
CHILD_START_TIMEOUT_S = 30.0
# The open attempts' deadline: far beyond the run.
ASYNC_TIMEOUT_S = 3_600
ENV = {
    # The bench migrates before starting them.
    "CRONHOOK_AUTO_MIGRATE": "false",
    # One scheduler process: its RSS and CPU are the scheduler's.
    "CRONHOOK_SCHEDULER_PROCESSES": "1",
}
# An open asynchronous attempt's lease owner (app/domain/completion.py, ASYNC_OWNER).
_OPEN = text("SELECT count(*) FROM jobs WHERE state = 'running' AND lease_owner = '~async'")
_STATES = text("SELECT state::text, count(*) FROM jobs WHERE target_id = CAST(:target AS uuid) GROUP BY 1")
_REPORTED = text(
    """
    SELECT count(*) FILTER (WHERE r.reported_at IS NOT NULL AND r.result IS NOT NULL AND r.outcome = 'success'),
           count(*)
    FROM runs r JOIN jobs j ON j.id = r.job_id WHERE j.target_id = CAST(:target AS uuid)
    """
)
_OUTCOMES = text(
    "SELECT r.outcome::text, count(*) FROM runs r JOIN jobs j ON j.id = r.job_id "
    "WHERE j.target_id = CAST(:target AS uuid) GROUP BY 1"
)
_TABLE_STATS = text(
    """
    SELECT relname, seq_scan, coalesce(idx_scan, 0), n_tup_ins, n_tup_upd, n_tup_hot_upd
    FROM pg_stat_user_tables WHERE relname IN ('jobs', 'runs', 'targets')
    """
)
_DB_STATS = text(
    "SELECT xact_commit, xact_rollback, tup_returned, tup_fetched, blks_hit, blks_read "
    "FROM pg_stat_database WHERE datname = current_database()"
)


# --- The children: the receiver, and the client that reports ----------------------------


class _Acceptor:
    """The receiver child: 202 and the completion URL kept for an async delivery, 200 to any
    other; per path, requests and the first and last arrival."""

    def __init__(self) -> None:
        self.urls: dict[str, str] = {}  # job id -> completion URL
        self.repeats = 0
        self.per_path: dict[str, list[float]] = {}  # path -> [requests, first, last]

    async def hook(self, request: web.Request) -> web.Response:
        arrived = time.time()
        await request.read()
        seen = self.per_path.setdefault(request.path, [0, arrived, arrived])
        seen[0] += 1
        seen[2] = arrived
        url = request.headers.get("cronhook-completion-url")
        if url is None:
            return web.Response(status=200, text="ok")
        job_id = request.headers.get("cronhook-job-id", "")
        if job_id in self.urls:
            self.repeats += 1
        self.urls[job_id] = url
        return web.Response(status=202, text="accepted")

    async def control(self, request: web.Request) -> web.Response:
        if request.match_info["what"] == "urls":
            return web.json_response(sorted(self.urls.values()))
        return web.json_response(
            {
                "accepted": len(self.urls),
                "repeats": self.repeats,
                "per_path": self.per_path,
                "cpu_s": time.process_time(),
            }
        )


async def _serve_receiver(parent: int) -> dict[str, Any] | None:
    acceptor = _Acceptor()
    app = web.Application()
    app.add_routes([web.get(CONTROL + "/{what}", acceptor.control), web.route("*", "/{tail:.*}", acceptor.hook)])
    async with listening(app) as (runner, stop):
        print(json.dumps({"port": runner.addresses[0][1]}), flush=True)
        while not stop.is_set() and os.getppid() == parent:  # never outlive the bench
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)
    return None


async def _post(session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str]) -> str:
    """One POST: its status, or the transport error's name."""
    try:
        async with session.post(url, data=body, headers=headers) as response:
            await response.read()
            return str(response.status)
    except (aiohttp.ClientError, TimeoutError) as exc:
        return type(exc).__name__


async def _closed_loop(plan: dict[str, Any]) -> dict[str, Any]:
    """K connections, one request in flight on each: the warm-up requests, then the measured
    ones (timed from the first measured send to the last measured answer)."""
    requests: list[list[str]] = plan["requests"]
    k, warmup, headers = int(plan["k"]), int(plan["warmup"]), dict(plan["headers"])
    bodies = [(url, body.encode()) for url, body in requests]
    statuses: collections.Counter[str] = collections.Counter()
    latencies: list[float] = []
    connector = aiohttp.TCPConnector(limit=k)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        for start in range(0, warmup, k):
            chunk = bodies[start : min(warmup, start + k)]
            await asyncio.gather(*(_post(session, url, body, headers) for url, body in chunk))
        queue = iter(bodies[warmup:])
        t0 = time.monotonic()

        async def worker() -> None:
            for url, body in queue:
                sent = time.monotonic()
                statuses[await _post(session, url, body, headers)] += 1
                latencies.append(time.monotonic() - sent)

        await asyncio.gather(*(worker() for _ in range(k)))
        elapsed = time.monotonic() - t0
    latencies.sort()
    done = len(latencies)
    return {
        "k": k,
        "warmup": warmup,
        "done": done,
        "statuses": dict(statuses),
        "elapsed_s": round(elapsed, 3),
        "per_s": round(done / elapsed, 1) if elapsed > 0 else None,
        "p50_ms": round(percentile(latencies, 50) * 1000, 2) if latencies else None,
        "p99_ms": round(percentile(latencies, 99) * 1000, 2) if latencies else None,
    }


async def _hold(plan: dict[str, Any]) -> dict[str, Any]:
    """Heartbeat rounds every `every_s` over the attempts not completed yet, while the first
    `complete` URLs are completed at an even pace over `hold_s`."""
    urls: list[str] = plan["urls"]
    complete_n, hold_s, every_s = int(plan["complete"]), float(plan["hold_s"]), float(plan["every_s"])
    k_heartbeat, k_complete = int(plan["k_heartbeat"]), int(plan["k_complete"])
    headers = {"Content-Type": "application/json"}
    ended: set[int] = set()  # completed, or being completed
    heartbeat_statuses: collections.Counter[str] = collections.Counter()
    completion_statuses: collections.Counter[str] = collections.Counter()
    rounds: list[dict[str, float]] = []
    connector = aiohttp.TCPConnector(limit=k_heartbeat + k_complete)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        t0 = time.monotonic()

        async def beat(pending: Iterator[int], body: bytes) -> int:
            """Heartbeats from `pending` one at a time, skipping attempts completed meanwhile."""
            sent = 0
            for i in pending:
                if i not in ended:
                    heartbeat_statuses[await _post(session, urls[i] + "/heartbeat", body, headers)] += 1
                    sent += 1
            return sent

        async def heartbeats() -> None:
            index = 0
            # A round late past the next one's time starts at once; none starts past hold_s.
            while (begin_at := t0 + index * every_s) < t0 + hold_s and time.monotonic() < t0 + hold_s:
                await asyncio.sleep(max(0.0, begin_at - time.monotonic()))
                began = time.monotonic()
                body = json.dumps({"progress": min(100, index * 10)}).encode()
                pending = iter([i for i in range(len(urls)) if i not in ended])
                counts = await asyncio.gather(*(beat(pending, body) for _ in range(k_heartbeat)))
                sent = sum(counts)
                took = time.monotonic() - began
                rounds.append({"at_s": round(began - t0, 2), "heartbeats": sent, "s": round(took, 2)})
                index += 1

        async def completions() -> None:
            slots = asyncio.Semaphore(k_complete)
            tasks: list[asyncio.Task[None]] = []

            async def complete(i: int) -> None:
                try:
                    body = json.dumps({"outcome": "succeeded", "result": {"rows": i, "phase": "hold"}}).encode()
                    completion_statuses[await _post(session, urls[i], body, headers)] += 1
                finally:
                    slots.release()

            for i in range(complete_n):
                await asyncio.sleep(max(0.0, t0 + (i + 0.5) * hold_s / complete_n - time.monotonic()))
                ended.add(i)
                await slots.acquire()
                tasks.append(asyncio.create_task(complete(i)))
            await asyncio.gather(*tasks)

        await asyncio.gather(heartbeats(), completions())
        elapsed = time.monotonic() - t0
    busy_s = sum(r["s"] for r in rounds)
    sent = sum(r["heartbeats"] for r in rounds)
    return {
        "elapsed_s": round(elapsed, 2),
        "rounds": rounds,
        "late_rounds": sum(1 for r in rounds if r["s"] > every_s),
        "heartbeats": sent,
        "heartbeat_statuses": dict(heartbeat_statuses),
        "heartbeat_rps": round(sent / busy_s, 1) if busy_s > 0 else None,
        "completions": sum(completion_statuses.values()),
        "completion_statuses": dict(completion_statuses),
    }


def _child_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description="async_completion.py's receiver and client")
    parser.add_argument("role", choices=("receiver", "client"))
    parser.add_argument("--parent", type=int, default=os.getppid())
    parser.add_argument("--plan", type=Path, help="client: the JSON plan")
    args = parser.parse_args(argv)
    try:
        import uvloop

        run: Callable[[Coroutine[Any, Any, dict[str, Any] | None]], Any] = uvloop.run
    except ImportError:
        run = asyncio.run
    if args.role == "receiver":
        run(_serve_receiver(args.parent))
        return 0
    plan = json.loads(args.plan.read_text())
    result = run(_hold(plan) if plan["kind"] == "hold" else _closed_loop(plan))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    result["cpu_s"] = round(usage.ru_utime + usage.ru_stime, 2)
    print(json.dumps(result), flush=True)
    return 0


# --- The bench's handles on its children ------------------------------------------------------


class AsyncReceiver:
    """The receiver child (started as `--child receiver`), stopped by pid."""

    def __init__(self) -> None:
        self._proc: asyncio.subprocess.Process | None = None
        self._session: aiohttp.ClientSession | None = None
        self.url = ""

    async def __aenter__(self) -> AsyncReceiver:
        argv = [__file__, "--child", "receiver", "--parent", str(os.getpid())]
        pipe = asyncio.subprocess.PIPE
        self._proc = await asyncio.create_subprocess_exec(sys.executable, *argv, stdout=pipe, start_new_session=True)
        assert self._proc.stdout is not None
        try:
            line = await asyncio.wait_for(self._proc.stdout.readline(), CHILD_START_TIMEOUT_S)
            self.url = f"http://127.0.0.1:{int(json.loads(line)['port'])}"
        except (TimeoutError, ValueError, KeyError):
            await self.stop()
            raise RuntimeError("the receiver did not start") from None
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _get(self, what: str) -> Any:
        assert self._session is not None
        async with self._session.get(f"{self.url}{CONTROL}/{what}") as response:
            response.raise_for_status()
            return await response.json()

    async def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = await self._get("stats")
        return result

    async def urls(self) -> list[str]:
        result: list[str] = await self._get("urls")
        return result

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 15)
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def run_client(plan: dict[str, Any], workdir: Path, timeout_s: float) -> dict[str, Any]:
    """The client child on `plan`: its JSON result (killed past `timeout_s`)."""
    path = workdir / f"plan-{secrets.token_hex(4)}.json"
    path.write_text(json.dumps(plan))
    argv = [__file__, "--child", "client", "--plan", str(path), "--parent", str(os.getpid())]
    pipe = asyncio.subprocess.PIPE
    proc = await asyncio.create_subprocess_exec(sys.executable, *argv, stdout=pipe, stderr=pipe, start_new_session=True)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        path.unlink(missing_ok=True)
    lines = [line for line in out.decode(errors="replace").splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"the client failed (rc {proc.returncode}): {err.decode(errors='replace')[-500:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


# --- The run ------------------------------------------------------------------------------


class Cpu:
    """CPU seconds of named process trees, between marks."""

    def __init__(self, pids: dict[str, int]) -> None:
        self._pids = pids
        self._at = self.now()

    def now(self) -> dict[str, float]:
        return {name: tree_cpu_s(pid) for name, pid in self._pids.items()}

    def lap(self) -> dict[str, float]:
        now = self.now()
        spent = {name: now[name] - self._at[name] for name in now}
        self._at = now
        return spent


async def table_stats(engine: AsyncEngine) -> dict[str, float]:
    """Counters of the statistics collector (tables jobs, runs, targets; the database)."""
    async with engine.connect() as conn:
        out: dict[str, float] = {}
        for name, *values in await conn.execute(_TABLE_STATS):
            for field, value in zip(("seq_scan", "idx_scan", "ins", "upd", "hot_upd"), values, strict=True):
                out[f"{name}.{field}"] = float(value)
        row = (await conn.execute(_DB_STATS)).one()
        for field, value in zip(
            ("commits", "rollbacks", "tup_returned", "tup_fetched", "blks_hit", "blks_read"), row, strict=True
        ):
            out[f"db.{field}"] = float(value)
    return out


async def per_item_stats(engine: AsyncEngine, before: dict[str, float], items: int) -> dict[str, float]:
    """The counters' growth per item since `before`, once the backends have reported them
    (they flush about once a second)."""
    await asyncio.sleep(1.5)
    after = await table_stats(engine)
    return {key: round((after[key] - before.get(key, 0.0)) / max(items, 1), 2) for key in after}


async def scalar(engine: AsyncEngine, statement: Any, **params: Any) -> int:
    async with engine.connect() as conn:
        return int(await conn.scalar(statement, params) or 0)


def ceiling_plan(url: str, key: str, args: argparse.Namespace) -> dict[str, Any]:
    """The ceiling's create requests, as api_compare's load generator makes them."""
    target = str(uuid.uuid4())
    first = time.time() + DAY_S
    requests = [
        [url + "/v1/jobs", json.dumps({"target_id": target, "payload": {"i": i}, "run_at": rfc3339(first + i * 0.001)})]
        for i in range(args.warmup + args.requests)
    ]
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    return {"kind": "closed", "k": args.connections, "warmup": args.warmup, "requests": requests, "headers": headers}


async def ceiling_run(
    name: str, args: argparse.Namespace, workdir: Path, server: Any, api_python: Path, peers: Path, pg_pid: int
) -> dict[str, Any]:
    dsn = await asyncio.to_thread(server.create_database, name)
    ceiling = await asyncio.to_thread(api_compare.Ceiling, api_python, peers, dsn, workdir / f"{name}.log")
    try:
        cpu = Cpu({"server": ceiling.proc.pid, "postgres": pg_pid})
        out = await run_client(ceiling_plan(ceiling.url, ceiling.key, args), workdir, args.deadline)
        spent = cpu.lap()
    finally:
        await asyncio.to_thread(ceiling.stop)
    requests = args.warmup + out["done"]
    out["server_cpu_ms"] = round(spent["server"] * 1000 / requests, 3)
    out["postgres_cpu_ms"] = round(spent["postgres"] * 1000 / requests, 3)
    print(f"{name}: {out['per_s']} creates/s, p99 {out['p99_ms']} ms, statuses {out['statuses']}", flush=True)
    return out


async def wait_for(
    what: str, check: Callable[[], Awaitable[bool]], alive: Callable[[], None], deadline_s: float
) -> float:
    """Polls `check` every 0.05 s until true; the seconds it took (raises past the deadline)."""
    started = time.monotonic()
    while not await check():
        alive()
        if time.monotonic() - started > deadline_s:
            raise RuntimeError(f"{what}: not within {deadline_s:g} s")
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def probe_burst(
    args: argparse.Namespace, api: Service, receiver: AsyncReceiver, path: str, alive: Callable[[], None]
) -> dict[str, Any]:
    """--probe-jobs sync jobs due at one instant to `path`: their claim and delivery rate."""
    target_id = await asyncio.to_thread(api.create_target, receiver.url + path)
    n = args.probe_jobs
    due = time.time() + args.lead_s + n / 5_000
    await asyncio.to_thread(create_jobs_batch, api, target_id, n, due, 0.0)
    await asyncio.sleep(max(0.0, due - time.time()))

    async def all_there() -> bool:
        return bool(int((await receiver.stats())["per_path"].get(path, [0])[0]) >= n)

    await wait_for(f"the probe burst to {path}", all_there, alive, args.deadline)
    count, first, last = (await receiver.stats())["per_path"][path]
    return {
        "jobs": n,
        "requests": int(count),
        "first_ms": round((first - due) * 1000, 1),
        "drain_s": round(last - due, 3),
        "deliveries_per_s": round(n / max(last - due, 1e-3), 1),
    }


class RssSampler:
    """The scheduler's and the API's RSS every 0.5 s while running (the most seen)."""

    def __init__(self, services: dict[str, Service]) -> None:
        self._services = services
        self.most: dict[str, float] = dict.fromkeys(services, 0.0)
        self._task: asyncio.Task[None] | None = None

    def now(self) -> dict[str, float]:
        return {name: round(s.rss_bytes() / 2**20, 1) for name, s in self._services.items()}

    async def _loop(self) -> None:
        while True:
            for name, mb in self.now().items():
                self.most[name] = max(self.most[name], mb)
            await asyncio.sleep(0.5)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


async def cronhook_phases(
    args: argparse.Namespace, workdir: Path, dsn: str, pg_pid: int, receiver: AsyncReceiver
) -> dict[str, Any]:
    """Phases 2-6 on a running cronhook (API, one scheduler process, reaper)."""
    n: int = args.jobs
    focus: int = args.warmup + args.requests
    out: dict[str, Any] = {}
    engine = await migrated_engine(dsn)
    env = ENV | parse_env(args.env)
    api = Service(args.cronhook_cmd, dsn, workdir / "api.log", env)
    roles = [api]
    try:
        await asyncio.to_thread(api.start)
        # The scheduler mints the completion URLs: they point at the API.
        extra = env | {"CRONHOOK_PUBLIC_URL": api.base_url}
        scheduler = Service(args.scheduler_cmd, dsn, workdir / "scheduler.log", extra, "s1", api.api_key)
        reaper = Service("cronhook reaper", dsn, workdir / "reaper.log", extra, api_key=api.api_key)
        roles += [scheduler, reaper]
        for role in (scheduler, reaper):
            await asyncio.to_thread(role.start, False)
        for role in (scheduler, reaper):
            await asyncio.to_thread(role.wait_ready)

        def alive() -> None:
            for role in roles:
                role.check_alive()

        await wait_partitions_owned(engine, alive, args.settle_s)
        fields = {
            "name": "async-worker",
            "url": receiver.url + "/work",
            "completion": "async",
            "async_timeout_s": ASYNC_TIMEOUT_S,
            "heartbeat_timeout_s": args.heartbeat_timeout_s,
            # Open attempts take no delivery slot of the target (it sets no max_in_flight anyway).
            "async_counts_in_flight": False,
        }
        status, body = await asyncio.to_thread(api.api, "POST", "/v1/targets", fields)
        if status != 201:
            raise RuntimeError(f"POST /v1/targets answered {status}: {body}")
        target_id = uuid.UUID(body["id"])
        rss = RssSampler({"scheduler": scheduler, "api": api})
        out["rss_mb_before"] = rss.now()

        out["probe_before"] = await probe_burst(args, api, receiver, "/probe-before", alive)
        print(f"probe before: {out['probe_before']}", flush=True)

        # Phase 3: the N async jobs, all due at one instant after their creation.
        due = time.time() + args.lead_s + n / 5_000
        created_at = time.monotonic()
        for start in range(0, n, 1000):
            count = min(1000, n - start)
            status, body = await asyncio.to_thread(
                api.api, "POST", BATCH_PATH, batch_body(target_id, start, count, due, 0.0)
            )
            if status not in (200, 201) or (body or {}).get("conflicts"):
                raise RuntimeError(f"POST {BATCH_PATH} answered {status}: {str(body)[:300]}")
        out["create_s"] = round(time.monotonic() - created_at, 2)
        out["created_before_due"] = time.time() < due
        await asyncio.sleep(max(0.0, due - time.time()))
        cpu = Cpu({"scheduler": scheduler.pid, "api": api.pid, "postgres": pg_pid})
        rss.start()
        delivered_s: list[float] = []
        t_due = time.monotonic()

        async def all_open() -> bool:
            if not delivered_s and int((await receiver.stats())["accepted"]) >= n:
                delivered_s.append(time.monotonic() - t_due)
            return await scalar(engine, _OPEN) >= n

        open_s = await wait_for("every attempt open", all_open, alive, args.deadline)
        spent = cpu.lap()
        stats = await receiver.stats()
        _, first, last = stats["per_path"]["/work"]
        out.update(
            open_all_s=round(open_s, 3),
            open_rate_per_s=round(n / open_s, 1),
            delivered_all_s=round(delivered_s[0], 3) if delivered_s else None,
            delivery_rate_per_s=round(n / max(last - due, 1e-3), 1),
            first_delivery_ms=round((first - due) * 1000, 1),
            open_cpu_ms_per_job={name: round(s * 1000 / n, 3) for name, s in spent.items()},
        )
        out["rss_mb_open"] = rss.now()
        print(
            f"open: {n} attempts open {open_s:.2f} s after their due time ({out['open_rate_per_s']}/s; delivered "
            f"in {out['delivered_all_s']} s); RSS {out['rss_mb_open']} (before {out['rss_mb_before']})",
            flush=True,
        )

        out["probe_open"] = await probe_burst(args, api, receiver, "/probe-open", alive)
        print(f"probe while {n} open: {out['probe_open']}", flush=True)

        # Phase 5: heartbeats every interval while all but `focus` are completed over hold_s.
        urls = await receiver.urls()
        if len(urls) != n:
            raise RuntimeError(f"the receiver holds {len(urls)} completion URLs, not {n}")
        cpu.lap()
        hold_plan = {
            "kind": "hold",
            "urls": urls,
            "complete": n - focus,
            "hold_s": args.hold_s,
            "every_s": args.heartbeat_every_s,
            "k_heartbeat": args.heartbeat_connections,
            "k_complete": args.complete_connections,
        }
        hold = await run_client(hold_plan, workdir, args.hold_s + args.deadline)
        spent = cpu.lap()
        reports = hold["heartbeats"] + hold["completions"]
        hold["cpu_ms_per_report"] = {name: round(s * 1000 / max(reports, 1), 3) for name, s in spent.items()}
        hold["scheduler_cpu_pct"] = round(spent["scheduler"] * 100 / max(hold["elapsed_s"], 1e-3), 1)
        out["hold"] = hold
        out["open_after_hold"] = await scalar(engine, _OPEN)
        print(
            f"hold: {hold['heartbeats']} heartbeats in {len(hold['rounds'])} rounds ({hold['heartbeat_rps']}/s, "
            f"{hold['late_rounds']} late: {[r['s'] for r in hold['rounds']]} s), {hold['completions']} completions "
            f"{hold['completion_statuses']}; {out['open_after_hold']} still open",
            flush=True,
        )

        # Phase 6: the rest, as fast as the connections allow.
        rest = urls[n - focus :]
        body_of = [json.dumps({"outcome": "succeeded", "result": {"rows": i, "phase": "focus"}}) for i in range(focus)]
        plan = {
            "kind": "closed",
            "k": args.connections,
            "warmup": args.warmup,
            "requests": [[url, body_of[i]] for i, url in enumerate(rest)],
            "headers": {"Content-Type": "application/json"},
        }
        before = await table_stats(engine)
        cpu.lap()
        with profiled(args.profile, "async-completion-focus", api.pid) as profile:
            fig = await run_client(plan, workdir, args.deadline)
        spent = cpu.lap()
        if profile:
            fig["profile"] = brief(profile)
        fig["server_cpu_ms"] = round(spent["api"] * 1000 / focus, 3)
        fig["postgres_cpu_ms"] = round(spent["postgres"] * 1000 / focus, 3)
        fig["per_completion"] = await per_item_stats(engine, before, focus)
        out["focus"] = fig
        print(f"focus: {fig['per_s']} completions/s, p99 {fig['p99_ms']} ms, statuses {fig['statuses']}", flush=True)

        await asyncio.sleep(1.0)
        await rss.stop()
        out["rss_mb_most_open"] = rss.most
        out["rss_mb_after"] = rss.now()
        async with engine.connect() as conn:
            out["states"] = {s: int(c) for s, c in await conn.execute(_STATES, {"target": str(target_id)})}
            reported, run_rows = (await conn.execute(_REPORTED, {"target": str(target_id)})).one()
            out["run_outcomes"] = {o: int(c) for o, c in await conn.execute(_OUTCOMES, {"target": str(target_id)})}
        out.update(runs_reported=int(reported), runs=int(run_rows), repeats=(await receiver.stats())["repeats"])
    finally:
        for role in roles:
            role.terminate()  # a graceful stop for all at once; each then waited for
        for role in reversed(roles):
            await asyncio.to_thread(role.stop)
        await engine.dispose()
    return out


async def own_phases(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """The ceiling, cronhook's phases, the ceiling again: one embedded PostgreSQL."""
    peers = load_peer("side_by_side", args.peers_dir).HERE
    env, api_env, pg = (load_peer(m) for m in ("env", "api_env", "pg"))
    peers_python, api_python = env.ensure_peers_venv(), api_env.ensure_api_venv()
    server, _ = await asyncio.to_thread(pg.start_embedded_pg, workdir / "pg", peers_python)
    pg_pid = int(server.info["postmaster_pid"])
    runs: dict[str, Any] = {}
    try:
        runs["ceiling"] = await ceiling_run("ceiling", args, workdir, server, api_python, peers, pg_pid)
        dsn = await asyncio.to_thread(server.create_database, "cronhook")
        async with AsyncReceiver() as receiver:
            cronhook = await cronhook_phases(args, workdir, dsn, pg_pid, receiver)
        if args.bracket:
            runs["ceiling_2"] = await ceiling_run("ceiling_2", args, workdir, server, api_python, peers, pg_pid)
    finally:
        await asyncio.to_thread(server.stop)
    return {"ceilings": runs, "cronhook": cronhook}


def peer_ratios(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """compare.py's burst and api_compare.py's single creates, through their own code."""
    burst_args = compare.parse(["--jobs", str(args.burst_jobs), "--systems", args.burst_systems])
    side_by_side = load_peer("side_by_side", args.peers_dir)
    systems = tuple(s for s in args.burst_systems.split(",") if s)
    raw = side_by_side.run(burst_args.jobs, extra=compare.make_extra(burst_args), systems=systems, quiet=True)
    burst = compare.summarize(raw, burst_args.jobs)
    print(
        f"burst of {burst_args.jobs}: {burst['cronhook_deliveries_per_s']} deliveries/s, ceiling "
        f"{burst['ceiling_deliveries_per_s']}, ratio {burst['ratio_vs_ceiling']}, lost {burst['lost']}, "
        f"duplicates {burst['duplicates']}",
        flush=True,
    )
    creates_dir = workdir / "api-compare"
    creates_dir.mkdir()
    creates = api_compare.run(api_compare.parse([]), creates_dir)
    print(f"single creates: {creates['runs']}; ratio {creates.get('ratio_vs_ceiling')}", flush=True)
    return {"burst": burst, "single_create": creates}


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    own = asyncio.run(own_phases(args, workdir))
    peers = peer_ratios(args, workdir) if args.peer_ratios else {}
    ceilings = own["ceilings"]
    mine = own["cronhook"]
    focus, hold = mine["focus"], mine["hold"]
    rates = [c["per_s"] for c in ceilings.values() if c.get("per_s")]
    ceiling_rps = sum(rates) / len(rates) if rates else None
    burst = peers.get("burst", {})
    creates = peers.get("single_create", {})
    return {
        "bench": "async_completion",
        "jobs": args.jobs,
        "open_all_s": mine["open_all_s"],
        "open_rate_per_s": mine["open_rate_per_s"],
        "delivery_rate_per_s": mine["delivery_rate_per_s"],
        "claim_rate_before_per_s": mine["probe_before"]["deliveries_per_s"],
        "claim_rate_open_per_s": mine["probe_open"]["deliveries_per_s"],
        "scheduler_rss_mb_before": mine["rss_mb_before"]["scheduler"],
        "scheduler_rss_mb_open": mine["rss_mb_most_open"]["scheduler"],
        "scheduler_rss_mb_after": mine["rss_mb_after"]["scheduler"],
        "api_rss_mb": {"before": mine["rss_mb_before"]["api"], "most": mine["rss_mb_most_open"]["api"]},
        "scheduler_cpu_pct_while_open": hold["scheduler_cpu_pct"],
        "heartbeat_rps": hold["heartbeat_rps"],
        "heartbeat_rounds_s": [r["s"] for r in hold["rounds"]],
        "heartbeat_late_rounds": hold["late_rounds"],
        "completion_rps": focus["per_s"],
        "completion_p99_ms": focus["p99_ms"],
        "api_ceiling_rps": None if ceiling_rps is None else round(ceiling_rps, 1),
        "ceiling_spread": round(max(rates) / min(rates), 3) if rates else None,
        "completion_ratio": round(focus["per_s"] / ceiling_rps, 3) if ceiling_rps and focus["per_s"] else None,
        "completion_cpu_ms": {"api": focus["server_cpu_ms"], "postgres": focus["postgres_cpu_ms"]},
        "ceiling_cpu_ms": {
            key: round(sum(c[f"{key}_cpu_ms"] for c in ceilings.values()) / max(len(ceilings), 1), 3)
            for key in ("server", "postgres")
        },
        "burst_ratio": (burst.get("ratio_vs_ceiling") or {}).get("deliveries_per_s"),
        "single_create_ratio": (creates.get("ratio_vs_ceiling") or {}).get("creates_per_s"),
        "connections": args.connections,
        "ceilings": ceilings,
        "cronhook": mine,
        "burst": burst or None,
        "single_create": creates or None,
    }


def problems(result: dict[str, Any]) -> list[str]:
    """What went wrong: a report refused, a job not succeeded with its result, a repeat."""
    mine, n = result["cronhook"], result["jobs"]
    found = []
    hold = mine["hold"]
    # A heartbeat may race its own attempt's completion (409): not an error.
    bad_heartbeats = {s: c for s, c in hold["heartbeat_statuses"].items() if s not in ("204", "409")}
    for what, statuses in (
        ("heartbeats", bad_heartbeats),
        ("hold completions", {s: c for s, c in hold["completion_statuses"].items() if s != "204"}),
        ("focus completions", {s: c for s, c in mine["focus"]["statuses"].items() if s != "204"}),
    ):
        if statuses:
            found.append(f"{what} answered {statuses}")
    if mine["states"] != {"succeeded": n}:
        found.append(f"job states {mine['states']}, not {n} succeeded")
    if mine["runs_reported"] != n or mine["runs"] != n:
        found.append(f"{mine['runs_reported']} runs with a reported result of {mine['runs']}, not {n}")
    if mine["repeats"]:
        found.append(f"{mine['repeats']} deliveries repeated")
    burst = result.get("burst") or {}
    if burst and (burst.get("lost") or burst.get("duplicates")):
        found.append(f"the burst lost {burst.get('lost')} and repeated {burst.get('duplicates')}")
    creates = result.get("single_create")
    if creates and not api_compare.answered_well(creates):
        found.append("api_compare: cronhook answered something other than a 2xx")
    return found


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=positive_int, default=10_000, help="async jobs open at once (10000)")
    parser.add_argument("--hold-s", type=float, default=60.0, help="seconds of heartbeats and paced completions (60)")
    parser.add_argument("--heartbeat-every-s", type=float, default=10.0, help="heartbeat interval per attempt (10)")
    parser.add_argument(
        "--heartbeat-timeout-s",
        type=positive_int,
        default=600,
        help="the target's heartbeat_timeout_s (600: late rounds are reported, the attempts outlive them; "
        "a lapsed attempt is failed by the reaper and its reports answered 410)",
    )
    parser.add_argument("--heartbeat-connections", type=positive_int, default=32, help="heartbeats in flight (32)")
    parser.add_argument("--complete-connections", type=positive_int, default=8, help="paced completions in flight")
    parser.add_argument("--connections", type=positive_int, default=64, help="focus and ceiling connections (64)")
    parser.add_argument("--warmup", type=positive_int, default=200, help="unmeasured focus/ceiling requests (200)")
    parser.add_argument("--requests", type=positive_int, default=3000, help="measured focus/ceiling requests (3000)")
    parser.add_argument("--probe-jobs", type=positive_int, default=2000, help="sync jobs of each probe burst (2000)")
    parser.add_argument("--lead-s", type=float, default=2.0, help="seconds from a creation to its due time (2)")
    parser.add_argument("--deadline", type=float, default=240.0, help="seconds any one wait or client run may take")
    parser.add_argument("--no-bracket", dest="bracket", action="store_false", help="the ceiling once, before")
    parser.add_argument(
        "--no-peer-ratios", dest="peer_ratios", action="store_false", help="skip compare.py's and api_compare.py's runs"
    )
    parser.add_argument("--burst-jobs", type=positive_int, default=5000, help="compare.py's burst (5000)")
    parser.add_argument("--burst-systems", default="ceiling", help="compare.py's peers (ceiling)")
    parser.add_argument("--scheduler-cmd", default="cronhook scheduler", help='the scheduler ("cronhook scheduler")')
    add_service_args(parser, "cronhook api")
    add_yardstick_args(parser)
    smoke = {
        "jobs": 60,
        "hold_s": 2.0,
        "heartbeat_every_s": 1.0,
        "heartbeat_connections": 4,
        "complete_connections": 2,
        "connections": 4,
        "warmup": 5,
        "requests": 25,
        "probe_jobs": 20,
        "lead_s": 0.5,
        "deadline": 30.0,
        "settle_s": 0.2,
    }
    args = parse_args(parser, argv, smoke | {"bracket": False, "peer_ratios": False})
    if args.warmup + args.requests > args.jobs:
        parser.error("--warmup + --requests (the focus phase's completions) must not exceed --jobs")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    if raw[:1] == ["--child"]:
        return _child_main(raw[1:])
    args = parse(raw)
    result = run_bench("cronhook-async-completion-", lambda workdir: run(args, workdir))
    found = problems(result)
    result["problems"] = found
    print(
        f"{args.jobs} open in {result['open_all_s']} s; scheduler RSS {result['scheduler_rss_mb_before']} -> "
        f"{result['scheduler_rss_mb_open']} -> {result['scheduler_rss_mb_after']} MB; claim rate "
        f"{result['claim_rate_before_per_s']}/s idle, {result['claim_rate_open_per_s']}/s while open; "
        f"{result['completion_rps']} completions/s = {result['completion_ratio']} x the API ceiling "
        f"({result['api_ceiling_rps']}/s); burst {result['burst_ratio']} x, single creates "
        f"{result['single_create_ratio']} x"
    )
    for problem in found:
        print(f"PROBLEM: {problem}")
    print_result(result)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
