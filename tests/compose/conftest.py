"""Fixtures of the compose end-to-end test: a deployment of docker-compose.yml under a project
name of its own, taken down with its volumes (and the receiver removed) whatever happens."""

from __future__ import annotations

import secrets
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.compose.deployment import Deployment, Phases, free_loopback_port, require_docker


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "compose: builds and runs the compose deployment in Docker (deploy/compose-e2e/prepare.sh first); "
        "not part of `make test`",
    )


@pytest.fixture
def phases(capsys: pytest.CaptureFixture[str]) -> Iterator[Phases]:
    """Each phase's time, written as it ends (not captured), and the total at the end."""

    def write(line: str) -> None:
        with capsys.disabled():
            sys.stdout.write(f"\n{line}")
            sys.stdout.flush()

    timed = Phases(write)
    try:
        yield timed
    finally:
        timed.total()


@pytest.fixture
def deployment(phases: Phases) -> Iterator[Deployment]:
    require_docker()
    workdir = Path(tempfile.mkdtemp(prefix="cronhook-compose-e2e-"))
    deployed = Deployment(f"cronhook-e2e-{secrets.token_hex(3)}", workdir, free_loopback_port())
    try:
        yield deployed
    finally:
        with phases("down --volumes, receiver and secrets removed"):
            if deployed.receiver is not None:
                deployed.receiver.remove()
            deployed.compose("down", "--volumes", "--remove-orphans", "--timeout", "30", timeout=180)
            shutil.rmtree(workdir)
