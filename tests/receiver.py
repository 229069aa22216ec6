"""A real HTTP receiver on 127.0.0.1 that logs every request and answers as scripted."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from aiohttp import web


@dataclass
class Received:
    path: str
    headers: dict[str, str]  # names lowercased
    body: bytes
    at: float  # time.time() on arrival


@dataclass
class Reply:
    status: int = 200
    delay_s: float = 0.0
    body: bytes = b"ok"
    headers: dict[str, str] = field(default_factory=dict)
    # Hang until this is set (a receiver that stops answering), then answer.
    hold: asyncio.Event | None = None


class Receiver:
    def __init__(self) -> None:
        self.requests: list[Received] = []
        # Replies used in order, one per request; then `default`.
        self.script: list[Reply] = []
        self.default = Reply()
        # Replies by request path, where no script is left (before `default`).
        self.by_path: dict[str, Reply] = {}
        self._runner: web.AppRunner | None = None
        self.port = 0
        # Requests being answered right now, and the most ever at once, per path.
        self.in_flight: dict[str, int] = {}
        self.max_in_flight: dict[str, int] = {}

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        # A deep accept queue: hundreds of deliveries connect at once in the cluster tests, and
        # a dropped SYN would show up as a client timeout that is the receiver's fault.
        site = web.TCPSite(self._runner, "127.0.0.1", 0, backlog=2048)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {name.lower(): value for name, value in request.headers.items()}
        self.requests.append(Received(request.path, headers, body, time.time()))
        path = request.path
        self.in_flight[path] = self.in_flight.get(path, 0) + 1
        self.max_in_flight[path] = max(self.max_in_flight.get(path, 0), self.in_flight[path])
        try:
            reply = self.script.pop(0) if self.script else self.by_path.get(path, self.default)
            if reply.delay_s:
                await asyncio.sleep(reply.delay_s)
            if reply.hold is not None:
                await reply.hold.wait()
            return web.Response(status=reply.status, body=reply.body, headers=reply.headers)
        finally:
            self.in_flight[path] -= 1

    def webhook_ids(self) -> list[str]:
        return [r.headers["webhook-id"] for r in self.requests if "webhook-id" in r.headers]


async def wait_for(predicate: object, timeout: float = 30.0, interval: float = 0.05, message: str = "") -> None:
    """Polls `predicate` (sync or async callable) until it is truthy, or fails at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()  # type: ignore[operator]
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message or predicate}")
        await asyncio.sleep(interval)
