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
