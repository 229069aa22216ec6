"""The outcomes' group commit waits for more only while outcomes arrive fast: a steady few
hundred a second go out in batches, a lone outcome (a quiet scheduler, a chain's next hop)
is written at once, and a large batch never waits."""

from __future__ import annotations

import pytest

from app.services.recorder import LINGER_FULL_BATCH, LINGER_MAX_S, BatchLinger


def _arrivals(gap_s: float, count: int) -> BatchLinger:
    linger = BatchLinger()
    for i in range(count):
        linger.arrived(1000.0 + i * gap_s)
    return linger


def test_a_lone_outcome_is_written_at_once() -> None:
    assert _arrivals(0.001, 1).wait_s(1) == 0.0


def test_outcomes_a_millisecond_apart_wait_for_a_batch_but_not_long() -> None:
    linger = _arrivals(0.001, 200)
    assert linger.wait_s(1) == pytest.approx(LINGER_MAX_S, rel=0.05)
    # Nearly full: only as long as the rest takes to arrive at that rate.
    assert linger.wait_s(LINGER_FULL_BATCH - 2) == pytest.approx(0.002, rel=0.05)
    assert linger.wait_s(LINGER_FULL_BATCH) == 0.0


def test_outcomes_too_sparse_to_fill_a_batch_are_written_at_once() -> None:
    # 100 a second: a wait of LINGER_MAX_S would bring two or three more, not worth holding.
    assert _arrivals(0.010, 200).wait_s(1) == 0.0


def test_a_pause_in_arrivals_ends_the_waiting_at_once() -> None:
    linger = _arrivals(0.001, 200)
    linger.arrived(2000.0)  # the first outcome after a quiet spell
    assert linger.wait_s(1) == 0.0
