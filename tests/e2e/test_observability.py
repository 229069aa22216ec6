"""Metrics, request ids, access and delivery logs, probes and port clashes, on real processes."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
from pathlib import Path

import httpx
import pytest

from app.metrics import sample_value
from tests.e2e.live_server import live_server
from tests.e2e.test_processes import CRONHOOK, Processes, base_env, free_port
from tests.receiver import Receiver, Reply, wait_for

pytestmark = pytest.mark.e2e


async def test_metrics_move_with_real_deliveries_and_requests_carry_ids(
    receiver: Receiver, db_url: str, procs: Processes
) -> None:
    async with live_server(procs, db_url) as server, httpx.AsyncClient(base_url=server.url) as http:
        before = (await http.get("/metrics")).text
        target = (await http.post("/v1/targets", json={"name": "r", "url": receiver.url()}, headers=server.auth)).json()
        receiver.script = [Reply(status=200), Reply(status=400)]
        created = await http.post(
            "/v1/jobs",
            json={"target_id": target["id"], "delay_s": 0.001, "payload": {"n": 1}},
            headers={**server.auth, "X-Request-Id": "req-from-client-1"},
        )
        assert created.status_code == 201
        assert created.headers["x-request-id"] == "req-from-client-1"
        doomed = await http.post(
            "/v1/jobs", json={"target_id": target["id"], "delay_s": 0.5, "max_attempts": 1}, headers=server.auth
        )
        assert len(doomed.headers["x-request-id"]) == 32  # generated when the client sends none

        async def delivered_and_dead() -> bool:
            text = (await http.get("/metrics")).text
            return (
                sample_value(text, "cronhook_deliveries_total", {"outcome": "success", "status_class": "2xx"}) >= 1
                and sample_value(text, "cronhook_dead_letters_total", {"source": "delivery"}) >= 1
                and sample_value(text, "cronhook_partitions_owned") > 0
                # A sampled gauge (every 5 s): it may still show the last job as due for one
                # interval after its delivery.
                and sample_value(text, "cronhook_due_backlog") == 0
            )

        await wait_for(
            delivered_and_dead, timeout=30, interval=0.2, message="deliveries, a dead letter, partitions, no backlog"
        )
        after = (await http.get("/metrics")).text

    assert sample_value(before, "cronhook_deliveries_total") == 0
    assert sample_value(after, "cronhook_deliveries_total", {"outcome": "http_error", "status_class": "4xx"}) == 1
    assert sample_value(after, "cronhook_delivery_duration_seconds_count") == 2
    assert sample_value(after, "cronhook_delivery_lateness_seconds_count") == 2
    assert (
        sample_value(after, "cronhook_api_requests_total", {"route": "/v1/jobs", "method": "POST", "status": "201"})
        == 2
    )
    assert sample_value(after, "cronhook_api_request_duration_seconds_count", {"route": "/v1/targets"}) == 1

    lines = [json.loads(line) for line in procs.log("up").splitlines() if line.startswith("{")]
    access = [line for line in lines if line["event"] == "http_request" and line["route"] == "/v1/jobs"]
    assert {line["request_id"] for line in access} >= {"req-from-client-1"}
    assert all(line["level"] == "info" and line["status"] == 201 for line in access)
    deliveries = [line for line in lines if line["event"] == "delivery"]
    assert {(d["attempt"], d["status"], d["target_id"]) for d in deliveries} == {
        (1, 200, target["id"]),
        (1, 400, target["id"]),
    }
    assert all(isinstance(d["duration_ms"], int) and d["level"] == "info" for d in deliveries)
    log_text = procs.log("up")
    assert server.key not in log_text
    assert "\\u001b" not in log_text and "\x1b" not in log_text  # no terminal colours in JSON lines
    assert any(line["event"].startswith("Uvicorn running on") for line in lines)


async def test_a_scheduler_serves_metrics_and_health_on_its_own_port(db_url: str, procs: Processes) -> None:
    port = free_port()
    env = base_env(CRONHOOK_DATABASE_URL=db_url, CRONHOOK_METRICS_PORT=str(port))
    procs.start("scheduler", ["scheduler"], env)

    async def healthy() -> bool:
        check = await asyncio.create_subprocess_exec(CRONHOOK, "health", env=env, stderr=subprocess.DEVNULL)
        return await check.wait() == 0

    await wait_for(healthy, timeout=30, interval=0.3, message="cronhook health against the scheduler")
    async with httpx.AsyncClient() as http:

        async def owns_partitions() -> bool:
            text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
            return sample_value(text, "cronhook_partitions_owned") > 0

        await wait_for(owns_partitions, timeout=30, interval=0.3, message="partitions_owned on the scheduler")
    down = base_env(CRONHOOK_METRICS_PORT=str(free_port()))
    check = await asyncio.create_subprocess_exec(CRONHOOK, "health", env=down, stderr=subprocess.PIPE)
    _, err = await check.communicate()
    assert check.returncode == 1 and b"not answering" in err


@pytest.mark.parametrize("role", ["up", "api"])
def test_a_port_in_use_gives_one_clear_line_and_starts_nothing(role: str, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # No database URL: the embedded PostgreSQL would start in the data dir; it must not.
        env = base_env(CRONHOOK_DATA_DIR=str(tmp_path / "data"))
        result = subprocess.run(
            [CRONHOOK, role, "--port", str(port)], env=env, capture_output=True, text=True, timeout=30
        )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"cronhook: port {port} on 127.0.0.1 is already in use: choose another with --port or CRONHOOK_PORT"
    ]
    assert not (tmp_path / "data").exists()
