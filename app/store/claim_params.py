"""The claim's bind parameters (app/store/claim_statements.py builds the statements that take
them): the scheduler's fair shares, and the partitions it holds with their epochs, encoded as
the statements read them, so that each claim sends what the statement was built once for.
"""

from __future__ import annotations

import functools
import uuid
from typing import Any

from app.domain.fair_share import ClaimShares
from app.domain.partition import PARTITION_COUNT

# The most tenants one claim that skips full tenants looks at (the next claim starts at
# another one).
TENANT_PAGE = 200


def share_params(shares: ClaimShares | None, limit: int) -> dict[str, Any]:
    """The claim's fair-share bind parameters (None: no shares, for tools and tests)."""
    shares = shares or ClaimShares(tenant_share=limit, target_cap=limit)
    return {
        "tenant_ids": list(shares.tenant_free),
        "tenant_free": list(shares.tenant_free.values()),
        "tenant_share": shares.tenant_share,
        "target_ids": list(shares.target_free),
        "target_free": list(shares.target_free.values()),
        "target_cap": shares.target_cap,
        "full_tenants": shares.full_tenants,
        "full_targets": shares.full_targets,
        "tenant_page": TENANT_PAGE,
        "tenant_after": uuid.uuid4(),
    }


def epochs_by_partition(held: dict[int, int]) -> list[int | None]:
    """The held epochs as the claim takes them: element `partition` is its epoch, None
    where the partition is not held."""
    epochs: list[int | None] = [None] * PARTITION_COUNT
    for partition, epoch in held.items():
        epochs[partition] = epoch
    return epochs


@functools.lru_cache(maxsize=8)
def _held_partition_text(held: tuple[tuple[int, int], ...]) -> tuple[str, str]:
    epochs = epochs_by_partition(dict(held))
    partitions = "{" + ",".join(str(partition) for partition, _ in held) + "}"
    return partitions, "{" + ",".join("NULL" if epoch is None else str(epoch) for epoch in epochs) + "}"


def held_partition_params(held: dict[int, int]) -> dict[str, str]:
    """The claim's `partitions` and `epoch_by_partition`, as PostgreSQL array text. Sent as
    arrays, their 512 elements cost asyncpg an encoding and an isinstance check each, on
    every claim (a third of a small claim's client CPU); as text they are one string the
    server parses, and the same held partitions give the same strings (cached)."""
    partitions, epochs = _held_partition_text(tuple(held.items()))
    return {"partitions": partitions, "epoch_by_partition": epochs}
