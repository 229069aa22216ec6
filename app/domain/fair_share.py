"""Fair shares of one scheduler's delivery slots: how many more deliveries each tenant, and
each target without a max_in_flight of its own, may start now. Pure bookkeeping, no I/O:
the scheduler counts a slot when it claims a job and gives it back when the POST is
answered; the claim statement (app/store/claim_statements.py) takes the result as bind parameters.

Slots are never reserved: a free slot goes to whichever due job ranks first, so a quiet
tenant's share is used by busy ones. But no tenant holds more than `tenant_share` slots at
once, so a tenant whose receivers hang cannot take the slots the others' jobs need.
"""

from __future__ import annotations

import math
import uuid
from collections import Counter
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ClaimShares:
    """What one claim may take, per tenant and per target without an explicit limit."""

    # Tenants holding slots here -> slots left in their share; any other tenant: tenant_share.
    tenant_free: dict[uuid.UUID, int] = field(default_factory=dict)
    tenant_share: int = 1 << 30
    # Targets without max_in_flight with deliveries here -> slots left; any other: target_cap.
    target_free: dict[uuid.UUID, int] = field(default_factory=dict)
    target_cap: int = 1 << 30

    @property
    def full_tenants(self) -> list[uuid.UUID]:
        return [tenant for tenant, free in self.tenant_free.items() if free <= 0]

    @property
    def full_targets(self) -> list[uuid.UUID]:
        return [target for target, free in self.target_free.items() if free <= 0]


def tenant_share_of(concurrency: int, tenant_max_share: float) -> int:
    """The most slots one tenant may hold: at least one, so every tenant can deliver."""
    return max(1, math.floor(concurrency * tenant_max_share))


class SlotShares:
    """Deliveries in flight per tenant and per (default-capped) target on one scheduler."""

    def __init__(self, tenant_share: int, target_cap: int, refill: int) -> None:
        self.tenant_share = tenant_share
        self.target_cap = target_cap
        self._tenants: Counter[uuid.UUID] = Counter()
        self._targets: Counter[uuid.UUID] = Counter()
        # A tenant or target at its share frees this many slots before it is worth a claim
        # again (as the scheduler does for its whole concurrency), never more than half.
        self._tenant_refill = max(1, min(refill, tenant_share // 2))
        self._target_refill = max(1, min(refill, target_cap // 2))

    def claim_shares(self) -> ClaimShares:
        return ClaimShares(
            {tenant: self.tenant_share - held for tenant, held in self._tenants.items()},
            self.tenant_share,
            {target: self.target_cap - held for target, held in self._targets.items()},
            self.target_cap,
        )

    def take(self, tenant_id: uuid.UUID, target_id: uuid.UUID | None) -> None:
        """A claimed job holds a slot; `target_id` None: its target sets its own limit."""
        self._tenants[tenant_id] += 1
        if target_id is not None:
            self._targets[target_id] += 1

    def give_back(self, tenant_id: uuid.UUID, target_id: uuid.UUID | None) -> bool:
        """The job's POST was answered. True when a tenant or target that was at its share
        has freed enough slots that claiming again is worth it."""
        worth_a_claim = _release(self._tenants, tenant_id, self.tenant_share - self._tenant_refill)
        if target_id is not None:
            worth_a_claim |= _release(self._targets, target_id, self.target_cap - self._target_refill)
        return worth_a_claim

    def held_by(self, tenant_id: uuid.UUID) -> int:
        return self._tenants[tenant_id]

    def full_count(self) -> int:
        """Tenants and targets at their share (a claim skips their jobs)."""
        tenants = sum(1 for held in self._tenants.values() if held >= self.tenant_share)
        return tenants + sum(1 for held in self._targets.values() if held >= self.target_cap)


def _release(counts: Counter[uuid.UUID], key: uuid.UUID, wake_at: int) -> bool:
    counts[key] -= 1
    left = counts[key]
    if left <= 0:
        del counts[key]  # the parameter arrays list only who holds slots
    return left == wake_at
