"""Real `cronhook` processes, real signals, a real receiver."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.partition import PARTITION_COUNT
from app.store.tables import jobs, partition_leases
from tests.conftest import LOOPBACK_ALLOWED, TEST_SECRET_KEYS, make_job, make_target
from tests.ports import free_port as free_port  # re-exported: the e2e tests import it from here
from tests.receiver import Receiver, Reply, wait_for

pytestmark = pytest.mark.e2e

CRONHOOK = str(Path(sys.executable).parent / "cronhook")


def base_env(**overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRONHOOK_")}
    # Receivers listen on 127.0.0.1, which the egress policy refuses by default.
    env["CRONHOOK_EGRESS_ALLOW"] = LOOPBACK_ALLOWED
    # One process per command: tests name replicas and signal them one by one
    # (tests/e2e/test_children.py runs several).
    env["CRONHOOK_SCHEDULER_PROCESSES"] = "1"
    env["CRONHOOK_SECRET_KEYS"] = TEST_SECRET_KEYS
    env.update(overrides)
    return env


async def wait_until_ready(http: httpx.AsyncClient, timeout: float) -> None:
    async def ready() -> bool:
        try:
            return (await http.get("/readyz")).status_code == 200
        except httpx.TransportError:
            return False

    await wait_for(ready, timeout=timeout, interval=0.1, message="readyz")


# A process given SIGTERM waits for its deliveries in flight (at most the largest target
# timeout, 30 s by default) and then stops; past this it is reported as hung.
STOP_TIMEOUT_S = 45.0


class Processes:
    """The `cronhook` processes of one test. Each is stopped and reaped when the test ends,
    pass or fail; one that was still running then must exit 0 on SIGTERM."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.running: list[subprocess.Popen[bytes]] = []
        self.names: dict[int, str] = {}

    def start(self, name: str, args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        with (self.log_dir / f"{name}.log").open("wb") as log:
            # The child keeps its own copy of the descriptor.
            proc = subprocess.Popen([CRONHOOK, *args], env=env, stdout=log, stderr=subprocess.STDOUT)
        self.running.append(proc)
        self.names[proc.pid] = name
        return proc

    def log(self, name: str) -> str:
        return (self.log_dir / f"{name}.log").read_text()

    def terminate(self, proc: subprocess.Popen[bytes], timeout: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM (a stopped process is continued first), then the exit code."""
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.send_signal(signal.SIGTERM)
        return proc.wait(timeout=timeout)

    def stop_all(self) -> None:
        """Stops every process still running; fails on any that does not exit 0 on SIGTERM."""
        still_running = [proc for proc in self.running if proc.poll() is None]
        for proc in still_running:
            # A stopped process would hold its TERM until continued.
            proc.send_signal(signal.SIGCONT)
            proc.send_signal(signal.SIGTERM)
        problems = []
        for proc in still_running:
            name = self.names[proc.pid]
            try:
                code = proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                problems.append(f"{name} did not stop within {STOP_TIMEOUT_S:g} s of SIGTERM")
                continue
            if code != 0:
                problems.append(f"{name} exited {code} on SIGTERM:\n{self.log(name)[-2000:]}")
        assert not problems, "\n".join(problems)


def short_lease_env(db_url: str) -> dict[str, str]:
    return base_env(
        CRONHOOK_DATABASE_URL=db_url,
        CRONHOOK_LEASE_S="6",
        CRONHOOK_MAX_TARGET_TIMEOUT_S="3",
        CRONHOOK_LEASE_MARGIN_S="1",
        CRONHOOK_DEFAULT_TARGET_TIMEOUT_S="3",
        CRONHOOK_POLL_INTERVAL_S="0.1",
        CRONHOOK_REAPER_INTERVAL_S="0.3",
    )


async def test_sigkill_mid_delivery_then_the_reaper_returns_the_job_and_it_is_delivered(
    client: httpx.AsyncClient,
    auth: dict[str, str],
    receiver: Receiver,
    engine: AsyncEngine,
    db_url: str,
    procs: Processes,
) -> None:
    # The first delivery hangs almost to the target's timeout: the test has that long to kill
    # its scheduler mid-request, even on busy cores.
    receiver.script = [Reply(delay_s=2.9)]
    target = await make_target(client, auth, receiver.url(), timeout_s=3)
    job = await make_job(client, auth, target["id"], backoff_base_s=0.05, backoff_max_s=0.1)
    env = short_lease_env(db_url)

    victim = procs.start("scheduler-a", ["scheduler"], {**env, "CRONHOOK_REPLICA_ID": "victim"})
    await wait_for(lambda: len(receiver.requests) == 1, timeout=60, message="first delivery in flight")
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=5)
    async with engine.connect() as conn:
        row = (await conn.execute(select(jobs).where(jobs.c.id == job["id"]))).mappings().one()
    assert row["state"].value == "running" and row["lease_owner"] == "victim"

    procs.start("reaper", ["reaper"], env)
    procs.start("scheduler-b", ["scheduler"], {**env, "CRONHOOK_REPLICA_ID": "survivor"})

    async def succeeded() -> bool:
        state: str = (await client.get(f"/v1/jobs/{job['id']}", headers=auth)).json()["state"]
        return state == "succeeded"

    await wait_for(succeeded, timeout=60, interval=0.1, message="redelivery after lease expiry")
    first, second = receiver.requests[0], receiver.requests[-1]
    assert second.headers["cronhook-attempt"] == "2"
    assert second.headers["webhook-id"] == first.headers["webhook-id"]  # receivers can dedupe
    runs = (await client.get(f"/v1/jobs/{job['id']}/runs", headers=auth, params={"order": "asc"})).json()["items"]
    assert [(r["outcome"], r["attempt"]) for r in runs] == [("lease_expired", 1), ("success", 2)]
    # Not before the dead replica's lease ran out (both times on the database's clock).
    assert dt.datetime.fromisoformat(runs[1]["started_at"]) >= row["lease_expires_at"]
    assert len(receiver.requests) == 2


async def test_cronhook_up_serves_the_api_and_delivers_then_stops_on_sigterm(
    receiver: Receiver, db_url: str, procs: Processes
) -> None:
    port = free_port()
    key = "chk_e2e_bootstrap_key_for_tests"
    env = base_env(
        CRONHOOK_DATABASE_URL=db_url,
        CRONHOOK_BOOTSTRAP_API_KEY=key,
        CRONHOOK_POLL_INTERVAL_S="0.1",
    )
    service = procs.start("up", ["up", "--port", str(port)], env)
    base = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(base_url=base, timeout=5) as http:
        await wait_until_ready(http, timeout=60)
        auth = {"Authorization": f"Bearer {key}"}
        target = (await http.post("/v1/targets", json={"name": "r", "url": receiver.url()}, headers=auth)).json()
        job = (await http.post("/v1/jobs", json={"target_id": target["id"], "delay_s": 0.5}, headers=auth)).json()
        await wait_for(lambda: len(receiver.requests) == 1, timeout=60, message="delivery via cronhook up")

        async def succeeded() -> bool:
            state: str = (await http.get(f"/v1/jobs/{job['id']}", headers=auth)).json()["state"]
            return state == "succeeded"

        await wait_for(succeeded, timeout=30, message="succeeded")
    assert procs.terminate(service) == 0
    logs = procs.log("up")
    assert key not in logs and target["secret"] not in logs


async def test_cronhook_up_is_ready_once_its_schedulers_hold_their_partitions(
    db_url: str, engine: AsyncEngine, procs: Processes
) -> None:
    """`cronhook up` with two scheduler processes, started a moment apart: when /readyz first
    says ready, every partition is held and each of them holds its share, so a job due in
    the first seconds finds its partition's owner (no hand-over still to come)."""
    port = free_port()
    env = base_env(CRONHOOK_DATABASE_URL=db_url, CRONHOOK_SCHEDULER_PROCESSES="2")
    procs.start("up", ["up", "--port", str(port)], env)
    reasons: list[str] = []
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:

        async def ready() -> bool:
            try:
                answer = await http.get("/readyz")
            except httpx.TransportError:
                return False
            if answer.status_code != 200:
                reasons.append(answer.json().get("reason") or "")
            return answer.status_code == 200

        await wait_for(ready, timeout=60, interval=0.02, message="readyz")
        async with engine.connect() as conn:
            owned = (
                select(partition_leases.c.owner, func.count().label("n"))
                .where(partition_leases.c.owner.is_not(None), partition_leases.c.expires_at > func.now())
                .group_by(partition_leases.c.owner)
            )
            shares = {row.owner: row.n for row in await conn.execute(owned)}
    assert sum(shares.values()) == PARTITION_COUNT, reasons[-3:]
    assert len(shares) == 2 and min(shares.values()) >= PARTITION_COUNT // 2, (shares, reasons[-3:])
    # While it waited, it said so.
    assert all(reason.startswith("starting: ") for reason in reasons if "partition" in reason)


async def test_cronhook_up_with_embedded_postgres_starts_and_stops_its_server(procs: Processes) -> None:
    data_dir = Path(f"/tmp/chu{os.getpid()}")  # short: the socket path must stay small
    port = free_port()
    env = base_env(CRONHOOK_DATA_DIR=str(data_dir))
    try:
        service = procs.start("embedded", ["up", "--port", str(port)], env)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
            await wait_until_ready(http, timeout=60)
        postmaster = data_dir / "pg" / "postmaster.pid"
        assert postmaster.exists()
        assert procs.terminate(service) == 0
        # The embedded server was stopped with the service, not left running.
        await wait_for(lambda: not postmaster.exists(), timeout=30, message="embedded server stopped")
    finally:
        import shutil

        shutil.rmtree(data_dir, ignore_errors=True)


async def test_api_key_create_prints_only_the_key_and_it_works(
    client: httpx.AsyncClient, db_url: str, tmp_path: Path
) -> None:
    result = subprocess.run(
        [CRONHOOK, "api-key", "create", "--tenant", "acme"],
        env=base_env(CRONHOOK_DATABASE_URL=db_url, CRONHOOK_LOG_LEVEL="INFO"),
        capture_output=True,
        timeout=60,
        check=True,
    )
    lines = result.stdout.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith("chk_")
    key = lines[0]
    assert key not in result.stderr.decode()
    response = await client.get("/v1/jobs", headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 200


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"CRONHOOK_LEASE_S": "5", "CRONHOOK_MAX_TARGET_TIMEOUT_S": "30"}, "CRONHOOK_LEASE_S"),
        # A partition lease must survive several renew intervals.
        ({"CRONHOOK_PARTITION_LEASE_S": "5", "CRONHOOK_PARTITION_RENEW_S": "2"}, "CRONHOOK_PARTITION_LEASE_S"),
    ],
)
def test_bad_settings_are_refused_with_a_clear_message(env: dict[str, str], named: str) -> None:
    result = subprocess.run([CRONHOOK, "scheduler"], env=base_env(**env), capture_output=True, timeout=30)
    assert result.returncode == 2
    assert named in result.stderr.decode()


async def test_the_api_keeps_an_idle_connection_as_long_as_configured(db_url: str, procs: Processes) -> None:
    # Behind a load balancer, the API must outlast the balancer's idle timeout (60 s for
    # most): a server that closes an idle connection first races the balancer's next request
    # on it, which fails (a 502). uvicorn's own default is 5 s.
    default, short = free_port(), free_port()
    procs.start("default", ["api", "--port", str(default)], base_env(CRONHOOK_DATABASE_URL=db_url))
    procs.start(
        "short", ["api", "--port", str(short)], base_env(CRONHOOK_DATABASE_URL=db_url, CRONHOOK_HTTP_KEEP_ALIVE_S="1")
    )
    for port in (default, short):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
            await wait_until_ready(http, timeout=60)

    async def get_healthz(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int) -> None:
        writer.write(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 200"), head
        length = int(re.search(rb"content-length: (\d+)", head.lower()).group(1))  # type: ignore[union-attr]
        await asyncio.wait_for(reader.readexactly(length), 10)

    # The default: one connection, idle past uvicorn's 5 s, still serves the next request.
    reader, writer = await asyncio.open_connection("127.0.0.1", default)
    try:
        await get_healthz(reader, writer, default)
        await asyncio.sleep(6)  # the idle time is what is tested
        await get_healthz(reader, writer, default)
    finally:
        writer.close()
    # Configured at 1 s: the server closes the idle connection (end-of-file) on its own.
    reader, writer = await asyncio.open_connection("127.0.0.1", short)
    try:
        await get_healthz(reader, writer, short)
        assert await asyncio.wait_for(reader.read(1), 30) == b""
    finally:
        writer.close()
