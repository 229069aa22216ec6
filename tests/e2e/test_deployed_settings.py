"""The `cronhook` command started the way operators deploy it, on an external database: the
key ring is required, secrets come from files, the password may hold any character, several
hosts are followed, a malformed URL is one line, and `cronhook health --ready` answers from
the process's own view of the database. (Passwords against a server that checks them:
tests/e2e/test_database_faults.py.)"""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest

from app.db.engine import create_engine, normalize_url
from app.db.migrate import schema_is_current
from app.keyring import parse_key_ring
from tests.e2e.test_processes import CRONHOOK, Processes, base_env, free_port
from tests.receiver import wait_for
from tests.unit.test_database_url_and_secrets import MALFORMED

pytestmark = pytest.mark.e2e


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CRONHOOK, *args], env=env, capture_output=True, text=True, timeout=90)


def without_ring(**overrides: str) -> dict[str, str]:
    env = base_env(**overrides)
    env.pop("CRONHOOK_SECRET_KEYS")
    return env


def test_a_role_on_an_external_database_without_the_key_ring_refuses_to_start(db_url: str, tmp_path: Path) -> None:
    for command in ("migrate", "scheduler", "reaper", "api"):
        result = run(without_ring(CRONHOOK_DATABASE_URL=db_url, CRONHOOK_DATA_DIR=str(tmp_path)), command)
        assert result.returncode == 2, (command, result.stderr[-2000:])
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
        assert "CRONHOOK_SECRET_KEYS (or CRONHOOK_SECRET_KEYS_FILE) is required" in lines[0]
        assert "cronhook secrets new-key" in lines[0]
    # Nothing was generated for it to lose later.
    assert not (tmp_path / "secret-keys").exists()
    # The tools that never seal or open a target secret work without the ring (an operator
    # revoking a key from an admin box during an incident).
    listed = run(without_ring(CRONHOOK_DATABASE_URL=db_url, CRONHOOK_DATA_DIR=str(tmp_path)), "api-key", "list")
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert not (tmp_path / "secret-keys").exists()
    # The recipe the refusal names works where the refusal happens.
    made = run(without_ring(CRONHOOK_DATABASE_URL=db_url, CRONHOOK_DATA_DIR=str(tmp_path)), "secrets", "new-key")
    assert made.returncode == 0, made.stderr
    assert parse_key_ring(made.stdout.strip()).key_ids


@pytest.mark.parametrize(("raw", "says"), MALFORMED[1:])
def test_a_malformed_database_url_is_one_line_naming_the_setting(raw: str, says: str) -> None:
    result = run(base_env(CRONHOOK_DATABASE_URL=raw), "migrate")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"cronhook: invalid CRONHOOK_DATABASE_URL: Value error, {says}"] or (
        len(result.stderr.strip().splitlines()) == 1
        and result.stderr.startswith("cronhook: invalid CRONHOOK_DATABASE_URL:")
        and says in result.stderr
    ), result.stderr
    assert "Traceback" not in result.stderr and "hunter2" not in result.stderr


def _tcp_hosts(db_url: str) -> tuple[list[str], str]:
    """The test server as a host list entry (a socket directory or host:port) and the database."""
    url = normalize_url(db_url)
    socket_dir = url.query.get("host")
    if isinstance(socket_dir, str):
        return [socket_dir], url.database or ""
    return [f"{url.host}:{url.port or 5432}"], url.database or ""


async def test_migrate_follows_a_multi_host_url_past_a_dead_host(db_url: str, tmp_path: Path) -> None:
    hosts, database = _tcp_hosts(db_url)
    user = normalize_url(db_url).username
    # The first host refuses connections (nothing listens on port 1); libpq and cronhook go on.
    query = "&".join(f"host={h}" for h in ["127.0.0.1:1", *hosts])
    multi = f"postgresql://{user}@/{database}?{query}&target_session_attrs=read-write"
    password_file = tmp_path / "password"
    password_file.write_text("unused-by-trust-auth\n")
    result = run(base_env(CRONHOOK_DATABASE_URL=multi, CRONHOOK_DATABASE_PASSWORD_FILE=str(password_file)), "migrate")
    assert result.returncode == 0, result.stderr[-3000:]
    engine = create_engine(multi)
    try:
        assert await schema_is_current(engine)
    finally:
        await engine.dispose()


async def test_health_ready_answers_from_the_roles_database_view(db_url: str, procs: Processes) -> None:
    port = free_port()
    env = base_env(CRONHOOK_DATABASE_URL=db_url, CRONHOOK_METRICS_PORT=str(port))
    procs.start("reaper", ["reaper"], env)

    def ready() -> bool:
        return run(env, "health", "--ready").returncode == 0

    await wait_for(ready, timeout=60, interval=0.3, message="reaper ready")
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
        assert (await http.get("/readyz")).json() == {"status": "ready"}
    # Nothing listens on another port: not ready, one line, exit 1.
    other = run({**env, "CRONHOOK_METRICS_PORT": str(free_port())}, "health", "--ready")
    assert other.returncode == 1 and "is not answering" in other.stderr


@pytest.mark.parametrize("command", ["migrate", "api", "scheduler"])
def test_a_database_that_refuses_the_process_is_one_line(db_url: str, command: str) -> None:
    missing = normalize_url(db_url).set(database="cronhook_no_such_database").render_as_string(hide_password=False)
    env = base_env(CRONHOOK_DATABASE_URL=missing, CRONHOOK_PORT=str(free_port()), CRONHOOK_LOG_FORMAT="json")
    result = run(env, command)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("cronhook:")]
    assert line == (
        'cronhook: cannot use the database of CRONHOOK_DATABASE_URL: database "cronhook_no_such_database" '
        "does not exist (3D000)"
    )
