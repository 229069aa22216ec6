"""The scheduler's and reaper's probe port (app/services/probes.py), over a real socket on
127.0.0.1: what Prometheus, a container health check and a stray client get."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest

from app.services.probes import MAX_HEAD_BYTES, ProbeServer
from tests.e2e.test_processes import free_port


@pytest.fixture
async def probe_url() -> AsyncIterator[str]:
    server = ProbeServer(warn_s=5.0)
    port = free_port()
    await server.start("127.0.0.1", port)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await server.cleanup()


async def raw(url: str, request: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(request)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return answer


async def test_the_probes_answer_get_and_head(probe_url: str) -> None:
    async with httpx.AsyncClient(base_url=probe_url) as http:
        health = await http.get("/healthz")
        assert health.status_code == 200 and health.json() == {"status": "ok"}
        assert (await http.get("/livez?verbose=1")).json() == {"status": "ok"}
        metrics = await http.get("/metrics")
        assert metrics.status_code == 200 and metrics.headers["content-type"].startswith("text/plain")
        assert "# TYPE" in metrics.text
        # Nothing has committed in this process: not ready, with a reason.
        ready = await http.get("/readyz")
        assert ready.status_code in (200, 503) and ready.json()["status"] in ("ready", "unavailable")
        head = await http.head("/healthz")
        assert head.status_code == 200 and head.content == b""
        assert int(head.headers["content-length"]) == len(json.dumps({"status": "ok"}))


async def test_anything_else_is_a_clear_refusal(probe_url: str) -> None:
    async with httpx.AsyncClient(base_url=probe_url) as http:
        assert (await http.get("/nope")).status_code == 404
        post = await http.post("/healthz", content=b"{}")
        assert post.status_code == 405 and post.headers["allow"] == "GET, HEAD"
    assert (await raw(probe_url, b"NONSENSE\r\n\r\n")).startswith(b"HTTP/1.1 400 ")
    # An oversized head is not read on: the connection closes without an answer.
    assert await raw(probe_url, b"GET /healthz HTTP/1.1\r\nX: " + b"a" * MAX_HEAD_BYTES + b"\r\n\r\n") == b""
