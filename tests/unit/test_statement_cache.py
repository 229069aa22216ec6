"""Statements are built and compiled once per process: the scheduler's warm-up and its first
real outcome batch use the very same statement object, so the first batch compiles nothing
(a compile among the first deliveries made them 40-100 ms late)."""

from __future__ import annotations

from app.store import outcomes


def test_the_warm_up_and_the_batches_share_one_outcome_statement() -> None:
    warm_up = outcomes._finish_statement()
    assert outcomes._finish_statement(reported=False) is warm_up
    assert outcomes._finish_statement(False) is warm_up
    assert outcomes._finish_statement(reported=True) is outcomes._finish_statement(True)
    assert outcomes._finish_statement(reported=True) is not warm_up
