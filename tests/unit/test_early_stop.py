"""A SIGTERM while a service process starts (app/early_stop.py): before any event loop runs
it ends the process with exit 0; once a loop runs it is recorded for the role to act on,
never raised into the loop (uvloop would then fail to close, with a traceback)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator

import pytest

from app import early_stop


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    early_stop._requested.clear()
    yield
    early_stop._requested.clear()


def test_before_any_loop_it_exits_0() -> None:
    with pytest.raises(SystemExit) as exited:
        early_stop._on_sigterm(signal.SIGTERM, None)
    assert exited.value.code == 0 and not early_stop.requested()


def test_inside_a_running_loop_it_is_recorded_not_raised() -> None:
    async def starting() -> bool:
        early_stop._on_sigterm(signal.SIGTERM, None)  # would raise SystemExit into the loop
        await asyncio.sleep(0)
        return early_stop.requested()

    assert asyncio.run(starting()) is True
