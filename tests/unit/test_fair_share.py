"""The scheduler's per-tenant and per-target slot bookkeeping (app/domain/fair_share.py)."""

from __future__ import annotations

import uuid

import pytest

from app.domain.fair_share import SlotShares, tenant_share_of

TENANT, OTHER, TARGET = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()


@pytest.mark.parametrize(
    ("concurrency", "fraction", "share"), [(200, 0.5, 100), (200, 1.0, 200), (3, 0.25, 1), (1, 0.5, 1)]
)
def test_a_tenant_share_is_a_fraction_never_zero(concurrency: int, fraction: float, share: int) -> None:
    assert tenant_share_of(concurrency, fraction) == share


def test_claim_shares_list_who_holds_slots_and_who_is_full() -> None:
    shares = SlotShares(tenant_share=4, target_cap=2, refill=50)
    for _ in range(4):
        shares.take(TENANT, None)  # a target with its own max_in_flight: not counted
    shares.take(OTHER, TARGET)
    shares.take(OTHER, TARGET)
    claim = shares.claim_shares()
    assert claim.tenant_free == {TENANT: 0, OTHER: 2} and claim.tenant_share == 4
    assert claim.target_free == {TARGET: 0} and claim.target_cap == 2
    assert claim.full_tenants == [TENANT] and claim.full_targets == [TARGET]
    assert shares.full_count() == 2


def test_giving_back_wakes_the_scheduler_once_half_a_full_share_is_free_and_forgets_idle_tenants() -> None:
    shares = SlotShares(tenant_share=4, target_cap=100, refill=50)
    for _ in range(4):
        shares.take(TENANT, TARGET)
    assert shares.give_back(TENANT, TARGET) is False  # 3 held
    assert shares.give_back(TENANT, TARGET) is True  # 2 held: half the share is free
    assert shares.give_back(TENANT, TARGET) is False
    assert shares.give_back(TENANT, TARGET) is False
    assert shares.claim_shares().tenant_free == {} and shares.held_by(TENANT) == 0


def test_after_a_claim_that_filled_a_share_the_scheduler_waits_for_slots_rather_than_claim_again() -> None:
    from app.db.engine import create_engine
    from app.services.scheduler import HELD_BACK_WAIT_S, ClaimPass, Scheduler
    from app.services.scheduler_config import SchedulerConfig
    from tests.conftest import TEST_KEY_RING

    # Built without I/O: no connection is made.
    scheduler = Scheduler(create_engine("postgresql://nobody@127.0.0.1:9/none"), SchedulerConfig("r"), TEST_KEY_RING)
    # A full batch with no share filled: more is probably due, claim at once.
    assert scheduler.idle_wait_s(ClaimPass(requested=100, claimed=100, in_flight=100)) == 0.0
    # A full batch that filled a tenant's (or target's) share: the next claim would skip its
    # jobs, so wait for its slots to free up (the wake event), at most HELD_BACK_WAIT_S.
    full = ClaimPass(requested=100, claimed=100, in_flight=100, some_full=True)
    assert scheduler.idle_wait_s(full) == HELD_BACK_WAIT_S
    short = ClaimPass(requested=100, claimed=40, in_flight=40, some_full=True)
    assert scheduler.idle_wait_s(short) >= HELD_BACK_WAIT_S
