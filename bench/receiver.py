"""The benches' webhook receiver: one aiohttp server in a child process of its own, so that its
work neither shares a bench's event loop nor counts as the CPU of what the bench measures.

Every path answers; a route may fail or answer late:

    Reply()                          200 at once
    Reply(fail=0.10, slow=0.01, slow_s=3.0)
                                     500 to 10 % of requests, 200 after 3 s to 1 %, else 200
    Reply(slow=1.0, slow_s=30.0)     every request held 30 s (a hanging receiver)

Each request is written, once answered (or cut off when the receiver stops), as a `Receipt`:
its path, `webhook-id`, `cronhook-job-id`, `cronhook-attempt` and `cronhook-scheduled-for`
headers, when it arrived and when it was answered (epoch seconds), and the reply it got.
`Receiver.stats()` is the live view (requests in all and per path, distinct webhook ids, the time
of the latest new one, requests held per path), taken over HTTP on the receiver's own port (`/__receiver/...`,
not logged).

The child is this file run as a script (aiohttp and the standard library only, so it starts
quickly); it exits on SIGTERM, and by itself when the bench that started it has gone.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import datetime as dt
import functools
import json
import os
import random
import signal
import sys
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp
from aiohttp import web

CONTROL = "/__receiver"
START_TIMEOUT_S = 30.0
FLUSH_EVERY_S = 0.5


@dataclass(frozen=True)
class Reply:
    """How a route answers: 500 to a `fail` share of requests, 200 after `slow_s` to a `slow`
    share (a receiver slower than the target's timeout, or one that hangs), 200 at once else."""

    fail: float = 0.0
    slow: float = 0.0
    slow_s: float = 0.0


@dataclass(frozen=True)
class Receipt:
    path: str
    webhook_id: str
    job_id: str
    attempt: str
    scheduled_for: str
    arrived: float
    answered: float | None  # None: still held when the receiver stopped
    reply: str  # "ok", "fail" (500), "slow" (200 after slow_s), "cut" (held at the stop)

    @property
    def due(self) -> float | None:
        """`cronhook-scheduled-for` in epoch seconds (None when the request had none)."""
        return _epoch(self.scheduled_for) if self.scheduled_for else None


@dataclass(frozen=True)
class ReceiverStats:
    requests: int
    per_path: dict[str, int]  # requests
    distinct: int  # webhook ids
    last_new_at: float  # when the latest new webhook id arrived (epoch seconds), 0 before any
    held: dict[str, int]  # per path, now
    most_held: dict[str, int]  # per path, at any one time
    cpu_s: float  # the receiver's own


@functools.lru_cache(maxsize=65_536)
def _epoch(iso: str) -> float:
    return dt.datetime.fromisoformat(iso).timestamp()


def lateness_s(receipts: Iterable[Receipt]) -> list[float]:
    """Arrival minus `cronhook-scheduled-for`, per receipt that carried one, sorted."""
    return sorted(receipt.arrived - due for receipt in receipts if (due := receipt.due) is not None)


class Receiver:
    """The bench's handle on the receiver process (use it as an async context manager)."""

    def __init__(self, workdir: Path, routes: Mapping[str, Reply] | None = None, seed: int = 1) -> None:
        self._routes = dict(routes or {})
        self._seed = seed
        self._log = workdir / f"receipts-{os.getpid()}-{id(self):x}.jsonl"
        self._proc: asyncio.subprocess.Process | None = None
        self._session: aiohttp.ClientSession | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        routes = {path: dataclasses.asdict(reply) for path, reply in self._routes.items()}
        argv = [__file__, "--log", str(self._log), "--seed", str(self._seed), "--parent", str(os.getpid())]
        argv += ["--routes", json.dumps(routes)]
        pipe = asyncio.subprocess.PIPE
        self._proc = await asyncio.create_subprocess_exec(sys.executable, *argv, stdout=pipe, start_new_session=True)
        assert self._proc.stdout is not None
        line = await asyncio.wait_for(self._proc.stdout.readline(), START_TIMEOUT_S)
        try:
            self.port = int(json.loads(line)["port"])
        except (ValueError, KeyError):
            await self.stop()
            raise RuntimeError(f"the receiver did not start: {line!r}") from None
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))

    async def _control(self, what: str) -> Any:
        assert self._session is not None, "the receiver is not running"
        async with self._session.get(f"{self.url}{CONTROL}/{what}") as response:
            response.raise_for_status()
            return await response.json()

    async def stats(self) -> ReceiverStats:
        return ReceiverStats(**await self._control("stats"))

    async def receipts(self) -> list[Receipt]:
        """Every request answered so far (and, after stop(), those cut off), in answer order."""
        if self._session is not None:
            await self._control("flush")
        if not self._log.exists():
            return []
        text = await asyncio.to_thread(self._log.read_text)
        return [Receipt(*json.loads(line)) for line in text.splitlines() if line]

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):  # it may have just gone
                proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 15)
        except TimeoutError:
            proc.kill()
            await proc.wait()

    async def __aenter__(self) -> Receiver:
        await self.start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()


# --- The child process ----------------------------------------------------------------------


class _Server:
    def __init__(self, log: Path, routes: dict[str, Reply], seed: int) -> None:
        self.routes = routes
        self.rng = random.Random(seed)
        self.log = log.open("a")
        self.pending: list[str] = []
        self.requests = 0
        self.per_path: collections.Counter[str] = collections.Counter()
        self.seen: set[str] = set()
        self.last_new_at = 0.0
        self.held: collections.Counter[str] = collections.Counter()
        self.most_held: collections.Counter[str] = collections.Counter()

    async def hook(self, request: web.Request) -> web.Response:
        arrived = time.time()
        await request.read()
        headers = request.headers
        webhook_id = headers.get("webhook-id", "")
        self.requests += 1
        self.per_path[request.path] += 1
        if webhook_id not in self.seen:
            self.seen.add(webhook_id)
            self.last_new_at = arrived
        reply = self.routes.get(request.path)
        kind = "ok"
        if reply is not None:
            draw = self.rng.random()
            kind = "slow" if draw < reply.slow else "fail" if draw < reply.slow + reply.fail else "ok"
        fields: list[Any] = [request.path, webhook_id, headers.get("cronhook-job-id", "")]
        fields += [headers.get("cronhook-attempt", ""), headers.get("cronhook-scheduled-for", ""), arrived]
        if kind == "slow":
            assert reply is not None
            path = request.path
            self.held[path] += 1
            self.most_held[path] = max(self.most_held[path], self.held[path])
            try:
                await asyncio.sleep(reply.slow_s)
            except asyncio.CancelledError:
                self.pending.append(json.dumps([*fields, None, "cut"]))
                raise
            finally:
                self.held[path] -= 1
        self.pending.append(json.dumps([*fields, time.time(), kind]))
        return web.Response(status=500 if kind == "fail" else 200, text="ok")

    def flush(self) -> None:
        if self.pending:
            self.log.write("\n".join(self.pending) + "\n")
            self.pending.clear()
        self.log.flush()

    async def control(self, request: web.Request) -> web.Response:
        what = request.match_info["what"]
        if what == "flush":
            self.flush()
            return web.json_response({"flushed": True})
        return web.json_response(
            {
                "requests": self.requests,
                "per_path": dict(self.per_path),
                "distinct": len(self.seen),
                "last_new_at": self.last_new_at,
                "held": dict(self.held),
                "most_held": dict(self.most_held),
                "cpu_s": time.process_time(),
            }
        )


@contextlib.asynccontextmanager
async def listening(app: web.Application) -> AsyncIterator[tuple[web.AppRunner, asyncio.Event]]:
    """`app` served on 127.0.0.1 (a free port: the runner's address), with an event that
    SIGTERM or SIGINT sets; the server is cleaned up (held requests cut off) on the way out."""
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    # A deep accept queue: every scheduler opens up to `concurrency` connections at once.
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
    await site.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        yield runner, stop
    finally:
        await runner.cleanup()


async def _serve(log: Path, routes: dict[str, Reply], seed: int, parent: int) -> None:
    server = _Server(log, routes, seed)
    app = web.Application(client_max_size=64 * 2**20)
    app.add_routes([web.get(CONTROL + "/{what}", server.control), web.route("*", "/{tail:.*}", server.hook)])
    async with listening(app) as (runner, stop):
        print(json.dumps({"port": runner.addresses[0][1], "pid": os.getpid()}), flush=True)
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), FLUSH_EVERY_S)
            except TimeoutError:
                pass
            server.flush()
            if os.getppid() != parent:
                break  # the bench has gone: do not outlive it
    # Held requests were cut off (and written) by the clean-up.
    server.flush()
    server.log.close()


def _main() -> None:
    parser = argparse.ArgumentParser(description="the benches' receiver (started by receiver.Receiver)")
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--routes", default="{}", help="JSON: {path: Reply fields}")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--parent", type=int, default=os.getppid())
    args = parser.parse_args()
    routes = {path: Reply(**fields) for path, fields in json.loads(args.routes).items()}
    asyncio.run(_serve(args.log, routes, args.seed, args.parent))


if __name__ == "__main__":
    _main()
