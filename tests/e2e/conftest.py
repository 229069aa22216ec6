"""Fixtures for tests that run real `cronhook` processes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.services.scheduler import Scheduler
from app.services.scheduler_config import SchedulerConfig
from app.settings import Settings
from tests.conftest import TEST_KEY_RING
from tests.e2e.test_processes import Processes


@pytest.fixture
async def scheduler(engine: AsyncEngine, settings: Settings) -> AsyncIterator[Scheduler]:
    """One in-process scheduler replica, driven by the test through run_once()."""
    sched = Scheduler(engine, SchedulerConfig.from_settings(settings), TEST_KEY_RING)
    try:
        yield sched
    finally:
        await sched.close(grace_s=5)


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    processes = Processes(tmp_path)
    try:
        yield processes
    finally:
        # Stops and reaps them even when the test failed; fails the test on a bad exit.
        processes.stop_all()
