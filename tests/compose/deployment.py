"""Driving a real compose deployment from a test: the compose client (Debian's docker-compose v1
or `docker compose`), the project's containers and their health, the receiver container on the
project's network, and timed phases.

Everything runs through the docker and compose command lines with a deadline; waits poll until
a deadline, they never sleep a fixed time."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
MAKE_SECRETS = ROOT / "deploy" / "make-secrets.sh"
RECEIVER_SCRIPT = ROOT / "deploy" / "compose-e2e" / "receiver.py"
PREPARE = "deploy/compose-e2e/prepare.sh"
# What deploy/images/build-standins.sh builds (prepare.sh runs it); PYTHON_IMAGE and
# POSTGRES_IMAGE in the environment choose others (the official images work the same).
STANDIN_IMAGES = {
    "PYTHON_IMAGE": "cronhook-standin/python:3.11-bookworm",
    "POSTGRES_IMAGE": "cronhook-standin/postgres:15-bookworm",
}
# Variables of the environment the test passes on to compose; every other variable that
# docker-compose.yml reads is dropped, so a developer's shell or .env cannot change the run.
PASSED_ON = ("PYTHON_IMAGE", "POSTGRES_IMAGE", "PIP_INDEX_URL")
RECEIVER_PORT = 8000
POLL_S = 0.25


def run(*args: str, timeout: float = 120, env: dict[str, str] | None = None, check: bool = True) -> str:
    """A command's stdout; a non-zero exit fails with the end of its output."""
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{' '.join(args)} took more than {timeout:g} s") from None
    if check and done.returncode != 0:
        raise AssertionError(
            f"{' '.join(args)} exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
        )
    return done.stdout


def wait_until(predicate: Callable[[], Any], timeout: float, message: str) -> Any:
    """Polls `predicate` until it returns something truthy (returned), or fails at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {message}")
        time.sleep(POLL_S)


def free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def compose_client() -> list[str]:
    """E2E_COMPOSE (e.g. "docker compose"), else docker-compose (v1) when installed, else v2."""
    chosen = os.environ.get("E2E_COMPOSE")
    if chosen:
        return chosen.split()
    return ["docker-compose"] if shutil.which("docker-compose") else ["docker", "compose"]


def require_docker() -> None:
    """Fails (never skips) when there is no engine or no base image: the deployment must run."""
    try:
        run("docker", "info", "--format", "{{.ServerVersion}}", timeout=20)
    except (AssertionError, FileNotFoundError) as exc:
        raise AssertionError(f"no Docker engine answers; run {PREPARE} first ({exc})") from None
    for variable, standin in STANDIN_IMAGES.items():
        image = os.environ.get(variable, standin)
        if image == standin:
            # Stand-ins exist only where prepare.sh built them; official images may be pulled.
            run("docker", "image", "inspect", "--format", "{{.Id}}", image, timeout=20)


@dataclass
class Phases:
    """Times each phase of the test and writes it at once (a CI log shows where a run hangs)."""

    write: Callable[[str], None]
    timings: list[tuple[str, float]] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        began = time.monotonic()
        try:
            yield
        finally:
            took = time.monotonic() - began
            self.timings.append((name, took))
            self.write(f"compose e2e: {name:<52} {took:6.1f} s")

    def total(self) -> None:
        self.write(f"compose e2e: {'total':<52} {time.monotonic() - self.started:6.1f} s")


@dataclass
class Deployment:
    """One compose project of docker-compose.yml, with its own secrets, API port and name."""

    project: str
    workdir: Path
    api_port: int
    client: list[str] = field(default_factory=compose_client)
    receiver: Receiver | None = None

    def __post_init__(self) -> None:
        self.secrets_dir = self.workdir / "secrets"
        self.env_file = self.workdir / "compose.env"
        values = {
            "SECRETS_DIR": str(self.secrets_dir),
            "API_PORT": str(self.api_port),
            "CRONHOOK_EGRESS_ALLOW": "receiver",
        }
        values |= {name: os.environ.get(name, default) for name, default in STANDIN_IMAGES.items()}
        values |= {name: os.environ[name] for name in PASSED_ON if name in os.environ}
        self.env_file.write_text("".join(f"{name}={value}\n" for name, value in values.items()))
        read = set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", COMPOSE_FILE.read_text()))
        self._env = {name: value for name, value in os.environ.items() if name not in read} | values

    @property
    def network(self) -> str:
        return f"{self.project}_default"

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def make_secrets(self) -> None:
        run(str(MAKE_SECRETS), str(self.secrets_dir), timeout=30)

    def secret(self, name: str) -> str:
        return (self.secrets_dir / name).read_text().strip()

    def _command(self, *args: str) -> list[str]:
        project = ["--project-name", self.project, "--file", str(COMPOSE_FILE), "--env-file", str(self.env_file)]
        return [*self.client, *project, *args]

    def compose(self, *args: str, timeout: float = 180) -> str:
        return run(*self._command(*args), timeout=timeout, env=self._env)

    def compose_fails(self, *args: str, timeout: float = 60) -> str:
        """The output of a compose command that must fail."""
        done = subprocess.run(
            self._command(*args),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self._env,
            cwd=ROOT,
        )
        assert done.returncode != 0, f"compose {' '.join(args)} succeeded:\n{done.stdout}"
        return done.stdout + done.stderr

    def containers(self, service: str | None = None, running_only: bool = False) -> list[dict[str, Any]]:
        """`docker inspect` of the project's containers (of `service`), by name."""
        filters = ["--filter", f"label=com.docker.compose.project={self.project}"]
        if service:
            filters += ["--filter", f"label=com.docker.compose.service={service}"]
        ids = run("docker", "ps", "--quiet", *([] if running_only else ["--all"]), *filters, timeout=30).split()
        if not ids:
            return []
        found: list[dict[str, Any]] = json.loads(run("docker", "inspect", *ids, timeout=30))
        return sorted(found, key=lambda c: str(c["Name"]))

    def wait_healthy(self, expected: dict[str, int], timeout: float) -> None:
        """Until `expected` (service: containers) all run and report healthy, and `migrate` has
        exited 0; fails at once if migrate failed."""

        def states() -> dict[str, list[str]]:
            seen: dict[str, list[str]] = {}
            for container in self.containers():
                service = container["Config"]["Labels"]["com.docker.compose.service"]
                state = container["State"]
                if service == "migrate" and state["Status"] == "exited" and state["ExitCode"] != 0:
                    raise AssertionError(f"migrate exited {state['ExitCode']}:\n{self.logs('migrate')}")
                health = state.get("Health", {}).get("Status", "none")
                seen.setdefault(service, []).append(f"{state['Status']}/{health}")
            return seen

        def all_healthy() -> bool:
            seen = states()
            return all(seen.get(name, []).count("running/healthy") == count for name, count in expected.items())

        try:
            wait_until(all_healthy, timeout, "every service healthy")
        except AssertionError:
            raise AssertionError(f"not healthy after {timeout:g} s: {states()}\n{self.logs()}") from None

    def logs(self, *services: str, tail: int = 30) -> str:
        try:
            return self.compose("logs", "--no-color", f"--tail={tail}", *services, timeout=60)
        except AssertionError as exc:
            return f"(no logs: {exc})"

    def start_receiver(self) -> Receiver:
        """The receiver, on the project's network (which `up` made), on the Python base image."""
        self.receiver = Receiver(self, self._env["PYTHON_IMAGE"])
        self.receiver.start()
        return self.receiver

    def psql(self, sql: str) -> str:
        (postgres,) = self.containers("postgres", running_only=True)
        return run("docker", "exec", postgres["Id"], "psql", "-U", "cronhook", "-d", "cronhook", "-Atc", sql).strip()


class Receiver:
    """The webhook receiver container (deploy/compose-e2e/receiver.py) on the deployment's
    network as host `receiver`, read by the test through a port published on 127.0.0.1.

    It starts on Docker's default bridge, which holds the published port, and joins the
    deployment's network besides: leaving that network (before `down`) and joining it again
    (after `up`) would lose a port published there."""

    def __init__(self, deployment: Deployment, image: str) -> None:
        self.deployment = deployment
        self.name = f"{deployment.project}-receiver"
        self.image = image
        self.url = ""

    def start(self) -> None:
        run(
            "docker", "run", "--detach", "--init", "--name", self.name,
            "--network", "bridge",
            "--publish", f"127.0.0.1::{RECEIVER_PORT}",
            "--volume", f"{RECEIVER_SCRIPT}:/receiver.py:ro",
            "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges:true",
            "--user", "65534:65534",
            self.image, "python3", "/receiver.py",
            timeout=60,
        )  # fmt: skip
        self.join_network()
        published = run("docker", "port", self.name, f"{RECEIVER_PORT}/tcp", timeout=30).split()[0]
        self.url = f"http://{published}"
        wait_until(self._answers, 30, "the receiver to answer")

    def _answers(self) -> bool:
        try:
            return httpx.get(f"{self.url}/_received?since=0", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def received(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = httpx.get(f"{self.url}/_received?since=0", timeout=10).json()["items"]
        return items

    def leave_network(self) -> None:
        """Before `down`: a network with an endpoint left cannot be removed."""
        run("docker", "network", "disconnect", "--force", self.deployment.network, self.name, timeout=30)

    def join_network(self) -> None:
        run("docker", "network", "connect", "--alias", "receiver", self.deployment.network, self.name, timeout=30)

    def remove(self) -> None:
        run("docker", "rm", "--force", "--volumes", self.name, timeout=60, check=False)
