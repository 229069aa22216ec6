"""Memory of the API under concurrent worst-case lists (issue 11 item 6).

Starts `cronhook api` on a fresh database, creates 200 jobs with ~250 KB payloads each
(random text: nothing compresses), then runs rounds of 20 concurrent `GET /v1/jobs?limit=200`
(payloads omitted by default) and of 20 concurrent `...&include=payload` (pages stop at
about 1 MiB of payloads), sampling the server's RSS every 20 ms, and times another
tenant's request meanwhile. Prints the peak RSS of each phase; JSON on the last line.

    python bench/list_memory.py --database-url postgresql://postgres@127.0.0.1:5432/postgres
"""

from __future__ import annotations

import argparse
import asyncio
import random
import secrets
import string
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
import psutil
from harness import Service, add_service_args, last_json_line, parse_env, run_bench
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from app.db.engine import normalize_url

JOBS = 200
PAYLOAD_CHARS = 250 * 1024
CONCURRENT = 20
ROUNDS = 3


class RssSampler:
    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _rss(self) -> int:
        return sum(p.memory_info().rss for p in [self.process, *self.process.children(recursive=True)])

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._rss())
            time.sleep(0.02)

    def __enter__(self) -> RssSampler:
        self.peak = self._rss()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


async def _admin(server_url: str, statement: str) -> None:
    engine = create_async_engine(normalize_url(server_url), isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            await conn.execute(text(statement))
    finally:
        await engine.dispose()


async def _storm(service: Service, params: dict[str, str], other_key: str) -> dict[str, Any]:
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

        with RssSampler(service.pid) as sampler:
            started = time.perf_counter()
            latencies = []
            bytes_sent = 0
            for _ in range(ROUNDS):
                *sizes, latency = await asyncio.gather(*(one() for _ in range(CONCURRENT)), other_tenant())
                bytes_sent += sum(sizes)
                latencies.append(latency)
            elapsed = time.perf_counter() - started
    return {
        "peak_rss_mb": round(sampler.peak / 2**20, 1),
        "response_mb_per_list": round(bytes_sent / (ROUNDS * CONCURRENT) / 2**20, 2),
        "seconds": round(elapsed, 2),
        "other_tenant_max_s": round(max(latencies), 3),
    }


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    name = f"cronhook_listmem_{secrets.token_hex(4)}"
    asyncio.run(_admin(args.database_url, f'CREATE DATABASE "{name}"'))
    dsn = normalize_url(args.database_url).set(database=name).render_as_string(hide_password=False)
    env = {"CRONHOOK_TENANT_REQUESTS_PER_S": "0", **parse_env(args.env)}
    service = Service(args.cronhook_cmd, dsn, workdir / "cronhook.log", env)
    try:
        service.start()
        target_id = service.create_target("https://example.com/hook")
        rng = random.Random(7)
        for _ in range(JOBS):
            blob = "".join(rng.choices(string.ascii_letters + string.digits, k=PAYLOAD_CHARS))
            status, body = service.api(
                "POST", "/v1/jobs", {"target_id": str(target_id), "payload": {"blob": blob}, "delay_s": 86_400}
            )
            assert status == 201, body
        other_key = _second_tenant_key(service)
        idle = psutil.Process(service.pid).memory_info().rss
        result: dict[str, Any] = {
            "bench": "list_memory",
            "jobs": JOBS,
            "payload_kb": PAYLOAD_CHARS // 1024,
            "concurrent": CONCURRENT,
            "rounds": ROUNDS,
            "idle_rss_mb": round(idle / 2**20, 1),
        }
        result["default_lists"] = asyncio.run(_storm(service, {}, other_key))
        print("default lists:", result["default_lists"])
        result["include_payload_lists"] = asyncio.run(_storm(service, {"include": "payload"}, other_key))
        print("include=payload lists:", result["include_payload_lists"])
        return result
    finally:
        service.stop()
        asyncio.run(_admin(args.database_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def _second_tenant_key(service: Service) -> str:
    out = subprocess.run(
        [service.argv[0], "api-key", "create", "--tenant", "bystander"],
        env=service.env,
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip().splitlines()[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database-url", required=True, help="a PostgreSQL server URL; a database is created and dropped"
    )
    add_service_args(parser, "cronhook api")
    args = parser.parse_args()
    last_json_line(run_bench("cronhook-listmem-", lambda workdir: run(args, workdir)))


if __name__ == "__main__":
    main()
