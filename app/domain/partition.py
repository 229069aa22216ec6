"""Mapping a job id to its virtual partition.

The partition count is fixed by the first migration (a CHECK constraint backs it): changing
it would move jobs between partitions, so it is a constant, not a setting.
"""

from __future__ import annotations

import hashlib
import uuid

PARTITION_COUNT = 256


def partition_for(job_id: uuid.UUID) -> int:
    """A stable hash of the id (not the id's own bits, so time-ordered ids spread too)."""
    digest = hashlib.blake2b(job_id.bytes, digest_size=8).digest()
    return int.from_bytes(digest, "big") % PARTITION_COUNT


def fair_share(replica_id: str, live_replicas: list[str], partition_count: int = PARTITION_COUNT) -> int:
    """How many partitions `replica_id` should hold among `live_replicas`.

    Every replica computes the same answer from the same list: shares sum to the partition
    count and differ by at most one (the first `count % n` replicas by id take the extra one).
    A replica missing from the list (its own heartbeat not yet visible) counts itself in.
    """
    members = sorted(set(live_replicas) | {replica_id})
    base, extra = divmod(partition_count, len(members))
    return base + (1 if members.index(replica_id) < extra else 0)
