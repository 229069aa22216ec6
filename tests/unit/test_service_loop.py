"""The one service loop (app/services/loop.py): what it asks of a service's wait policy, the
error backoff, the outage log, and the scheduler's own policy. No database: a fake service."""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass

import pytest

from app.services.loop import MAX_ERROR_BACKOFF_S, Jittered, run_forever
from app.services.scheduler import Scheduler
from app.services.scheduler_config import SchedulerConfig
from tests.conftest import TEST_KEY_RING


@dataclass(frozen=True)
class Pass:
    wait_s: float


class FakeService:
    """Fails its first `failures` passes (connection refused), then asks for `wait_s`; sets
    `wake` during the passes `wake_during` names; stops the loop after `passes` passes."""

    name = "fake"

    def __init__(self, stop: asyncio.Event, passes: int, failures: int = 0, wait_s: float = 0.001) -> None:
        self.wake = asyncio.Event()
        self._stop = stop
        self._passes = passes
        self._failures = failures
        self._wait_s = wait_s
        self.wake_during: set[int] = set()
        self.ran = 0

    async def tick(self) -> Pass:
        self.wake.clear()  # as the scheduler's pass does
        self.ran += 1
        if self.ran >= self._passes:
            self._stop.set()
        if self.ran in self.wake_during:
            self.wake.set()
        if self.ran <= self._failures:
            raise ConnectionRefusedError("database down")
        return Pass(self._wait_s)

    def idle_wait_s(self, result: Pass) -> float:
        return result.wait_s


class RecordingPolicy:
    """Sleeps nothing (the tests do not wait) and records what the loop asked."""

    def __init__(self) -> None:
        self.asked: list[tuple[float, bool]] = []
        self.sleeping_calls: list[float | None] = []

    def sleep_s(self, wait_s: float, failed: bool) -> float:
        self.asked.append((wait_s, failed))
        return wait_s

    def sleeping(self, sleep_s: float | None) -> None:
        self.sleeping_calls.append(sleep_s)


async def test_the_error_backoff_starts_at_half_a_second_and_doubles_to_its_ceiling(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def no_sleep(stop: asyncio.Event, wake: asyncio.Event, wait_s: float) -> None:
        return None

    monkeypatch.setattr("app.services.loop.wait_for_stop_or_wake", no_sleep)
    stop = asyncio.Event()
    service = FakeService(stop, passes=8, failures=7)
    policy = RecordingPolicy()
    await run_forever(service, stop, logging.getLogger("test"), wait_policy=policy)
    assert [wait for wait, failed in policy.asked if failed] == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert MAX_ERROR_BACKOFF_S == 10.0 and policy.asked[-1] == (0.001, False)


async def test_an_outage_is_logged_once_when_it_starts_and_once_when_it_ends(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def no_sleep(stop: asyncio.Event, wake: asyncio.Event, wait_s: float) -> None:
        return None

    monkeypatch.setattr("app.services.loop.wait_for_stop_or_wake", no_sleep)
    stop = asyncio.Event()
    caplog.set_level(logging.INFO, logger="test")
    await run_forever(FakeService(stop, passes=5, failures=4), stop, logging.getLogger("test"))
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == ["fake_db_unavailable", "fake_db_recovered"]


async def test_the_policy_hears_of_each_sleep_and_a_woken_loop_does_not_sleep() -> None:
    stop = asyncio.Event()
    service = FakeService(stop, passes=3)
    service.wake_during = {2}  # woken during the second pass: the next one runs at once
    policy = RecordingPolicy()
    await run_forever(service, stop, logging.getLogger("test"), wait_policy=policy)
    assert policy.sleeping_calls == [0.001, None, None, 0.001, None]


def test_the_default_policy_jitters_every_wait_from_its_one_random_source() -> None:
    first, again = Jittered(random.Random(7)), Jittered(random.Random(7))
    sleeps = [first.sleep_s(1.0, failed) for failed in (False, True, False)]
    assert sleeps == [again.sleep_s(1.0, failed) for failed in (False, True, False)]
    assert all(0.8 <= sleep <= 1.2 for sleep in sleeps) and len(set(sleeps)) == 3


def _scheduler(poll_interval_s: float = 0.2) -> Scheduler:
    from app.db.engine import create_engine

    # Built without I/O: no connection is made.
    engine = create_engine("postgresql://nobody@127.0.0.1:9/none")
    return Scheduler(engine, SchedulerConfig("r", poll_interval_s=poll_interval_s), TEST_KEY_RING, random.Random(3))


def test_the_scheduler_sleeps_exactly_to_the_next_due_time_and_jitters_only_a_full_poll() -> None:
    scheduler = _scheduler(poll_interval_s=0.2)
    assert scheduler.sleep_s(0.05, failed=False) == 0.05  # the next due time: exact
    assert scheduler.sleep_s(0.5, failed=True) == 0.5  # the error backoff: exact
    polls = {scheduler.sleep_s(0.2, failed=False) for _ in range(5)}
    assert len(polls) == 5 and all(0.16 <= poll <= 0.24 for poll in polls)
