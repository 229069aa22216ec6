"""Memory of the API under concurrent worst-case lists (issue 11 item 6).

Starts `cronhook api` on a fresh database (embedded, or a scratch one on --database-url's
server), creates --jobs (200) jobs with --payload-kb (~250 KB) payloads each (random text:
nothing compresses), then runs --rounds (3) rounds of --concurrent (20) concurrent
`GET /v1/jobs?limit=200` (payloads omitted by default) and as many of `...&include=payload`
(pages stop at about 1 MiB of payloads), sampling the server's RSS every 20 ms, and times
another tenant's request meanwhile. Prints the peak RSS of each phase; JSON on the last line.

    .venv/bin/python bench/list_memory.py
    .venv/bin/python bench/list_memory.py --database-url postgresql://postgres@127.0.0.1:5432/postgres
"""

from __future__ import annotations

import argparse
import asyncio
import random
import string
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
from harness import (
    BenchDatabase,
    Service,
    add_database_url_arg,
    add_service_args,
    parse_args,
    parse_env,
    positive_int,
    print_result,
    run_bench,
)


class RssSampler:
    """The peak resident memory of a service's process tree, sampled every 20 ms."""

    def __init__(self, service: Service) -> None:
        self._service = service
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._service.rss_bytes())
            time.sleep(0.02)

    def __enter__(self) -> RssSampler:
        self.peak = self._service.rss_bytes()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


async def _storm(args: argparse.Namespace, service: Service, params: dict[str, str], other_key: str) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {service.api_key}"}
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(service.base_url, timeout=timeout) as http:

        async def one() -> int:
            total = 0
            async with http.get("/v1/jobs", params={"limit": "200", **params}, headers=headers) as response:
                assert response.status == 200, await response.text()
                total += len(await response.read())
            return total

        async def other_tenant() -> float:
            await asyncio.sleep(0.05)
            started = time.perf_counter()
            async with http.get("/v1/targets", headers={"Authorization": f"Bearer {other_key}"}) as response:
                assert response.status == 200
            return time.perf_counter() - started

        with RssSampler(service) as sampler:
            started = time.perf_counter()
            latencies: list[float] = []
            bytes_sent = 0
            for _ in range(args.rounds):
                lists = asyncio.gather(*(one() for _ in range(args.concurrent)))
                sizes, latency = await asyncio.gather(lists, other_tenant())
                bytes_sent += sum(sizes)
                latencies.append(latency)
            elapsed = time.perf_counter() - started
    return {
        "peak_rss_mb": round(sampler.peak / 2**20, 1),
        "response_mb_per_list": round(bytes_sent / (args.rounds * args.concurrent) / 2**20, 2),
        "seconds": round(elapsed, 2),
        "other_tenant_max_s": round(max(latencies), 3),
    }


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    async with BenchDatabase(args.database_url) as url:
        service = Service(args.cronhook_cmd, url, workdir / "cronhook.log", parse_env(args.env))
        try:
            await asyncio.to_thread(service.start)
            return await measure(args, service)
        finally:
            await asyncio.to_thread(service.stop)


async def measure(args: argparse.Namespace, service: Service) -> dict[str, Any]:
    target_id = await asyncio.to_thread(service.create_target, "https://example.com/hook")
    rng = random.Random(7)
    for _ in range(args.jobs):
        blob = "".join(rng.choices(string.ascii_letters + string.digits, k=args.payload_kb * 1024))
        body = {"target_id": str(target_id), "payload": {"blob": blob}, "delay_s": 86_400}
        status, answer = await asyncio.to_thread(service.api, "POST", "/v1/jobs", body)
        if status != 201:
            raise RuntimeError(f"POST /v1/jobs answered {status}: {str(answer)[:300]}")
    other_key = await asyncio.to_thread(_second_tenant_key, service)
    result: dict[str, Any] = {
        "bench": "list_memory",
        "jobs": args.jobs,
        "payload_kb": args.payload_kb,
        "concurrent": args.concurrent,
        "rounds": args.rounds,
        "idle_rss_mb": round(service.rss_bytes() / 2**20, 1),
    }
    result["default_lists"] = await _storm(args, service, {}, other_key)
    print("default lists:", result["default_lists"])
    result["include_payload_lists"] = await _storm(args, service, {"include": "payload"}, other_key)
    print("include=payload lists:", result["include_payload_lists"])
    return result


def _second_tenant_key(service: Service) -> str:
    out = subprocess.run(
        [service.argv[0], "api-key", "create", "--tenant", "bystander"],
        env=service.env,
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip().splitlines()[-1]


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=positive_int, default=200, help="jobs with a large payload (200)")
    parser.add_argument("--payload-kb", type=positive_int, default=250, help="payload size of each (250 KB)")
    parser.add_argument("--concurrent", type=positive_int, default=20, help="lists at once (20)")
    parser.add_argument("--rounds", type=positive_int, default=3, help="rounds of concurrent lists per phase (3)")
    add_database_url_arg(parser)
    add_service_args(parser, "cronhook api", partitions=False)
    return parse_args(parser, argv, smoke={"jobs": 5, "payload_kb": 4, "concurrent": 2, "rounds": 1})


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    print_result(run_bench("cronhook-listmem-", lambda workdir: asyncio.run(run(args, workdir))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
