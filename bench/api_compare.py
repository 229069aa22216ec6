"""API creates: cronhook's `POST /v1/jobs` against the peers' API ceiling
(../shared/peers/api_ceiling.py: FastAPI + pydantic + one asyncpg INSERT on uvloop/httptools),
both driven by the peers' load generator (loadgen.py: K keep-alive connections, one request in
flight on each) in the same run, on one embedded PostgreSQL (a fresh database each).

Order: ceiling, cronhook, (cronhook batch), ceiling again (unless --no-bracket); the ratio is
against the mean of the ceiling runs, because this box's speed drifts over minutes. Each run: --warmup requests,
then --requests measured ones. Jobs are due a day ahead, so a `cronhook up` scheduler has
nothing to deliver meanwhile: at a `run_at` each, or (--delay, cronhook only) after a
`delay_s` of a day.

Per run: creates/s, p50/p99 latency (loadgen's), and CPU ms per request of the server process
tree, of PostgreSQL (postmaster and backends) and of the load generator, each taken over the
whole loadgen run and divided by all its requests (warm-up included).

--batch-items N also measures `POST /v1/jobs/batch` ({"jobs": [...]}, N jobs per request,
--batch-connections at once) in jobs/s; when the endpoint answers 404/405 it is reported as
skipped. --profile DIR records py-spy on cronhook during its single-create run (and its batch
run). Exit 1 when cronhook answered anything but a 2xx.

    .venv/bin/python bench/api_compare.py                          # cronhook api, 32 connections
    .venv/bin/python bench/api_compare.py --cronhook-cmd "cronhook up" --batch-items 1000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
from harness import (
    BATCH_PATH,
    Service,
    add_service_args,
    add_yardstick_args,
    batch_body,
    free_port,
    load_peer,
    parse_args,
    parse_env,
    percentile,
    positive_int,
    print_result,
    ratio,
    run_bench,
    stop_process,
    tree_cpu_s,
    wait_until_quiet,
)
from profiles import brief, print_profile, profiled

DAY_S = 86_400.0


class Ceiling:
    """api_ceiling.py in its own process (its venv), stopped by pid."""

    def __init__(self, python: Path, peers: Path, dsn: str, log: Path) -> None:
        self.port = free_port()
        self.key = "ceiling_" + secrets.token_hex(8)
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [str(python), str(peers / "api_ceiling.py"), "--dsn", dsn, "--port", str(self.port), "--key", self.key]
        with log.open("ab") as out:
            self.proc = subprocess.Popen([*argv, "--max-seconds", "900"], stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=2) as response:
                    if json.loads(response.read()).get("ok"):
                        return
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the API ceiling did not start: {log.read_text(errors='replace')[-500:]}")

    def stop(self) -> None:
        stop_process(self.proc)


def measured(loadgen: dict[str, Any], server_s: float, pg_s: float) -> dict[str, Any]:
    requests = loadgen["warmup"] + loadgen["done"]
    per = 1000 / max(requests, 1)
    return {
        "creates_per_s": loadgen["per_s"],
        "p50_ms": loadgen["p50_ms"],
        "p99_ms": loadgen["p99_ms"],
        "statuses": loadgen["statuses"],
        "errors": loadgen["errors"],
        "first_non_2xx": loadgen["first_non_2xx"],
        "server_cpu_ms": round(server_s * per, 3),
        "postgres_cpu_ms": round(pg_s * per, 3),
        "loadgen_cpu_ms": round(loadgen["cpu_s"] * per, 3),
    }


async def batch_run(service: Service, target_id: uuid.UUID, args: argparse.Namespace, pg_pid: int) -> dict[str, Any]:
    """POST /v1/jobs/batch from --batch-connections clients; jobs/s over the measured requests."""
    items, total = args.batch_items, args.batch_requests
    first_due = time.time() + DAY_S
    bodies = [json.dumps(batch_body(target_id, r * items, items, first_due, 0.001)).encode() for r in range(total)]
    headers = {"Authorization": f"Bearer {service.api_key}", "Content-Type": "application/json"}
    statuses: dict[str, int] = {}
    latencies: list[float] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        async with session.post(service.base_url + BATCH_PATH, data=bodies[0], headers=headers) as response:
            if response.status in (404, 405):
                return {"skipped": f"POST {BATCH_PATH} answered {response.status}"}
            statuses[str(response.status)] = 1  # the probe doubles as warm-up; not timed
        queue = list(reversed(bodies[1:]))
        cpu0, pg0, t0 = service.cpu_s(), tree_cpu_s(pg_pid), time.monotonic()

        async def client() -> None:
            while queue:
                body = queue.pop()
                t = time.monotonic()
                async with session.post(service.base_url + BATCH_PATH, data=body, headers=headers) as response:
                    await response.read()
                    statuses[str(response.status)] = statuses.get(str(response.status), 0) + 1
                latencies.append((time.monotonic() - t) * 1000)

        await asyncio.gather(*(client() for _ in range(args.batch_connections)))
        elapsed = time.monotonic() - t0
        cpu_s, pg_s = service.cpu_s() - cpu0, tree_cpu_s(pg_pid) - pg0
    jobs = (total - 1) * items
    latencies.sort()
    return {
        "items_per_request": items,
        "requests": total - 1,
        "connections": args.batch_connections,
        "statuses": statuses,
        "jobs_per_s": round(jobs / elapsed, 1),
        "p50_ms": round(percentile(latencies, 50), 1),
        "p99_ms": round(percentile(latencies, 99), 1),
        "server_cpu_ms_per_job": round(cpu_s * 1000 / jobs, 4),
        "postgres_cpu_ms_per_job": round(pg_s * 1000 / jobs, 4),
    }


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    peers = load_peer("side_by_side", args.peers_dir).HERE
    env, api_env, pg, loadgen = (load_peer(m) for m in ("env", "api_env", "pg", "loadgen"))
    peers_python, api_python = env.ensure_peers_venv(), api_env.ensure_api_venv()
    server, _ = pg.start_embedded_pg(workdir / "pg", peers_python)
    pg_pid = int(server.info["postmaster_pid"])
    result: dict[str, Any] = {"bench": "api_compare", "k": args.connections, "requests": args.requests, "runs": {}}

    def drive(url: str, key: str, target_id: uuid.UUID, cpu: Any, delayed: bool = False) -> dict[str, Any]:
        cpu0, pg0 = cpu(), tree_cpu_s(pg_pid)
        # Due a day ahead: at an instant (`run_at`, set per request), or after a `delay_s`.
        body: dict[str, Any] = {"target_id": str(target_id), **({"delay_s": DAY_S} if delayed else {})}
        out = loadgen.run_loadgen(
            peers_python,
            url + "/v1/jobs",
            key,
            body,
            k=args.connections,
            warmup=args.warmup,
            n=args.requests,
            run_at_start=None if delayed else time.time() + DAY_S,
            run_at_step=0.001,
            timeout=args.deadline,
            log=workdir / "loadgen.log",
        )
        return measured(out, cpu() - cpu0, tree_cpu_s(pg_pid) - pg0)

    try:
        for name in ("ceiling", "cronhook", "ceiling_2") if args.bracket else ("ceiling", "cronhook"):
            dsn = server.create_database(name)
            if name.startswith("ceiling"):
                ceiling = Ceiling(api_python, peers, dsn, workdir / f"{name}.log")
                try:
                    fig = drive(ceiling.url, ceiling.key, uuid.uuid4(), lambda c=ceiling: tree_cpu_s(c.proc.pid))
                finally:
                    ceiling.stop()
                result["runs"][name] = fig
                print(f"{name}: {fig}")
                continue
            service = Service(args.cronhook_cmd, dsn, workdir / "cronhook.log", parse_env(args.env))
            try:
                service.start()
                target_id = service.create_target("http://127.0.0.1:9/never")
                # Not measured: children still importing (cronhook up's schedulers).
                settled = wait_until_quiet(service.cpu_s)
                print(f"cronhook quiet after {settled:.1f} s")
                with profiled(args.profile, "api-create", service.pid) as profile:
                    fig = drive(service.base_url, service.api_key, target_id, service.cpu_s, args.delay)
                result["profile"] = profile
                result["runs"]["cronhook"] = fig
                print(f"cronhook ({args.cronhook_cmd}): {fig}")
                if args.batch_items:
                    with profiled(args.profile, "api-batch", service.pid) as profile:
                        result["batch"] = asyncio.run(batch_run(service, target_id, args, pg_pid))
                    result["batch_profile"] = profile
                    print(f"cronhook batch: {result['batch']}")
            finally:
                service.stop()
    finally:
        server.stop()
    runs = result["runs"]
    ceilings = [runs[c] for c in ("ceiling", "ceiling_2") if runs.get(c, {}).get("creates_per_s")]
    mine = runs.get("cronhook", {})
    if ceilings and mine.get("creates_per_s"):
        rates = [c["creates_per_s"] for c in ceilings]
        result["ratio_vs_ceiling"] = {
            key: ratio(mine[key], sum(c[key] for c in ceilings) / len(ceilings))
            for key in ("creates_per_s", "p99_ms", "server_cpu_ms")
        }
        result["ceiling_spread"] = round(max(rates) / min(rates), 3)
    result["cmd"] = args.cronhook_cmd
    result["schedule"] = "delay_s" if args.delay else "run_at"
    return result


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=positive_int, default=32, help="keep-alive connections (32)")
    parser.add_argument("--warmup", type=positive_int, default=200, help="unmeasured requests first (200)")
    parser.add_argument("--requests", type=positive_int, default=3000, help="measured requests per run (3000)")
    parser.add_argument("--batch-items", type=int, default=0, help="also measure POST /v1/jobs/batch, N jobs each")
    parser.add_argument("--batch-requests", type=positive_int, default=41, help="batch requests (the first untimed)")
    parser.add_argument("--batch-connections", type=positive_int, default=4, help="batch requests in flight")
    parser.add_argument("--deadline", type=float, default=240.0, help="seconds per loadgen run before giving up")
    parser.add_argument(
        "--delay",
        action="store_true",
        help="cronhook's creates say delay_s (a day) instead of run_at (the ceiling takes only run_at)",
    )
    parser.add_argument(
        "--no-bracket",
        dest="bracket",
        action="store_false",
        help="run the ceiling once, before cronhook (not after too)",
    )
    add_service_args(parser, "cronhook api", partitions=False)
    add_yardstick_args(parser)
    smoke = {"connections": 4, "warmup": 5, "requests": 40, "batch_items": 10, "batch_requests": 3, "deadline": 30.0}
    return parse_args(parser, argv, smoke | {"bracket": False})


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    result = run_bench("cronhook-api-compare-", lambda workdir: run(args, workdir))
    for key, title in (("profile", "cronhook during single creates"), ("batch_profile", "cronhook during batches")):
        profile = result.pop(key, None)
        if profile:
            print_profile(title, profile)
            result[key] = brief(profile)
    ratio = result.get("ratio_vs_ceiling", {})
    print(
        f"cronhook {result['runs'].get('cronhook', {}).get('creates_per_s')} creates/s = "
        f"{ratio.get('creates_per_s')} x the API ceiling (spread {result.get('ceiling_spread')})"
    )
    print_result(result)
    return 0 if answered_well(result) else 1


def answered_well(result: dict[str, Any]) -> bool:
    """cronhook created jobs, and every answer it gave was a 2xx."""
    mine = result["runs"].get("cronhook", {})
    statuses = [*mine.get("statuses", {}), *result.get("batch", {}).get("statuses", {})]
    return bool(mine.get("creates_per_s")) and not mine.get("errors") and all(s.startswith("2") for s in statuses)


if __name__ == "__main__":
    sys.exit(main())
