"""The API's quota enforcement in one process: the tenant's request rate (shared across
replicas through a PostgreSQL token bucket), its limits and active-job count (cached
briefly), and failed-authentication throttling per client address.

Request rate: each replica takes tokens from the tenant's bucket row in chunks of about
0.1 s worth (per API key it saw) and spends them locally; chunks it does not spend within CHUNK_TTL_S lapse. So
the cluster never admits more than the bucket grants (rate, plus bursts of 2 s worth), it
costs about 10 round trips per second per busy tenant and replica rather than one per
request, and with several replicas sharing a small rate it may refuse slightly early.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import TypeVar

from app.db.async_engine import AsyncConnection, AsyncEngine
from app.db.errors import once_more_if_dead
from app.domain.quotas import TenantLimits
from app.settings import Settings, copy_settings
from app.store.quotas import api_rate_take, tenant_count_active_jobs, tenant_limits_get
from app.store.tenants import api_key_tenant, hash_api_key

CHUNK_S = 0.1
CHUNK_TTL_S = 0.5
# How long a replica trusts what it read of a tenant's limits and active jobs: a changed
# override applies within LIMITS_TTL_S; jobs created meanwhile are counted locally.
LIMITS_TTL_S = 5.0
ACTIVE_TTL_S = 1.0
MAX_TRACKED = 10_000


def default_limits(settings: Settings) -> TenantLimits:
    return copy_settings(TenantLimits, settings, prefix="tenant_")


@dataclass
class _Chunk:
    tokens: float
    expires: float
    empty_until: float = 0.0


K = TypeVar("K")
V = TypeVar("V")


class _Bounded(OrderedDict[K, V]):
    """Insertion-ordered map that forgets its oldest entries past MAX_TRACKED."""

    def put(self, key: K, value: V) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > MAX_TRACKED:
            self.popitem(last=False)


class _PerMinute:
    """A token bucket per key (an address, a token): `capacity` a minute, refilled
    continuously, kept by this replica for its MAX_TRACKED most recent keys."""

    def __init__(self, capacity: float) -> None:
        self.capacity = capacity
        self._buckets: _Bounded[str, tuple[float, float]] = _Bounded()

    def _tokens(self, key: str, now: float) -> float:
        tokens, at = self._buckets.get(key, (self.capacity, now))
        return min(self.capacity, tokens + (now - at) * self.capacity / 60)

    def _wait_s(self, tokens: float) -> float | None:
        return None if tokens >= 1 else (1 - tokens) * 60 / self.capacity

    def wait_s(self, key: str) -> float | None:
        """Seconds until the key has a token; None when it has one now (none taken)."""
        return self._wait_s(self._tokens(key, time.monotonic()))

    def take(self, key: str) -> None:
        """Takes a token, into debt if need be (a failure already made)."""
        now = time.monotonic()
        self._buckets.put(key, (self._tokens(key, now) - 1, now))

    def take_if_any(self, key: str) -> float | None:
        """Takes a token if the key has one (None); else the seconds until it will."""
        now = time.monotonic()
        tokens = self._tokens(key, now)
        if tokens < 1:
            return self._wait_s(tokens)
        self._buckets.put(key, (tokens - 1, now))
        return None


class Quotas:
    def __init__(self, engine: AsyncEngine, settings: Settings) -> None:
        self._engine = engine
        self._defaults = default_limits(settings)
        # By key hash: a request is admitted before its key is looked up on its connection.
        self._chunks: _Bounded[str, _Chunk] = _Bounded()
        self._refills: dict[str, asyncio.Lock] = {}
        self._limits: _Bounded[uuid.UUID, tuple[float, TenantLimits]] = _Bounded()
        self._active: _Bounded[uuid.UUID, tuple[float, int]] = _Bounded()
        self._auth_failures = _PerMinute(float(settings.failed_auth_per_min))
        self._reports = _PerMinute(float(settings.completion_reports_per_min))

    # Request rate -------------------------------------------------------------------------

    async def admit(self, key: str) -> float | None:
        """None to let a request with this API key through, or the seconds to wait (429).

        Runs before the request takes its own connection: a refill uses a connection of its
        own for a moment, so requests waiting on a refill never hold one (no pool deadlock).
        An unknown key passes here; authentication refuses it next.
        """
        key_hash = hash_api_key(key)
        now = time.monotonic()
        chunk = self._chunks.get(key_hash)
        if chunk is None or chunk.expires <= now or (chunk.tokens < 1 and chunk.empty_until <= now):
            lock = self._refills.setdefault(key_hash, asyncio.Lock())
            async with lock:
                chunk = self._chunks.get(key_hash)
                now = time.monotonic()
                if chunk is None or chunk.expires <= now or (chunk.tokens < 1 and chunk.empty_until <= now):
                    chunk = await self._refill(key_hash)
            if len(self._refills) > MAX_TRACKED:
                self._refills.clear()
        if chunk.tokens < 1:
            return max(chunk.empty_until - time.monotonic(), 0.0) or 1.0
        chunk.tokens -= 1
        return None

    async def _refill(self, key_hash: str) -> _Chunk:
        # As at the key look-up (app/api/deps.py): a dead pooled connection costs no request.
        return await once_more_if_dead(lambda: self._refill_once(key_hash))

    async def _refill_once(self, key_hash: str) -> _Chunk:
        now = time.monotonic()
        async with self._engine.begin() as conn:
            tenant_id = await api_key_tenant(conn, key_hash)
            if tenant_id is None:
                return _Chunk(math.inf, now)  # not a key: authentication answers
            known = self._limits.get(tenant_id)
            expected_rate = known[1].requests_per_s if known is not None else self._defaults.requests_per_s
            want = max(1, math.ceil((expected_rate or 10) * CHUNK_S))
            granted, left, rate = await api_rate_take(conn, tenant_id, self._defaults.requests_per_s, want)
        now = time.monotonic()
        if rate <= 0:
            chunk = _Chunk(math.inf, now + CHUNK_TTL_S)  # unlimited
        elif granted == 0:
            chunk = _Chunk(0, now + CHUNK_TTL_S, empty_until=now + max(0.0, 1 - left) / rate)
        else:
            chunk = _Chunk(granted, now + CHUNK_TTL_S)
        self._chunks.put(key_hash, chunk)
        return chunk

    # Limits and counts --------------------------------------------------------------------

    async def limits(self, conn: AsyncConnection, tenant_id: uuid.UUID) -> TenantLimits:
        cached = self._limits.get(tenant_id)
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        limits = self._defaults.overridden(await tenant_limits_get(conn, tenant_id))
        self._limits.put(tenant_id, (time.monotonic() + LIMITS_TTL_S, limits))
        return limits

    async def active_jobs(self, conn: AsyncConnection, tenant_id: uuid.UUID) -> int:
        cached = self._active.get(tenant_id)
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        count = await tenant_count_active_jobs(conn, tenant_id)
        self._active.put(tenant_id, (time.monotonic() + ACTIVE_TTL_S, count))
        return count

    def jobs_created(self, tenant_id: uuid.UUID, count: int = 1) -> None:
        cached = self._active.get(tenant_id)
        if cached is not None:
            self._active.put(tenant_id, (cached[0], cached[1] + count))

    def forget(self, tenant_id: uuid.UUID) -> None:
        """Drops what this replica cached of the tenant (its limits just changed here)."""
        self._limits.pop(tenant_id, None)
        self._active.pop(tenant_id, None)
        self._chunks.clear()

    # Failed authentication ----------------------------------------------------------------

    def auth_wait(self, address: str) -> float | None:
        """Seconds this address must wait before trying a key again; None if it may."""
        return self._auth_failures.wait_s(address)

    def auth_failed(self, address: str) -> None:
        self._auth_failures.take(address)

    # Completion reports ------------------------------------------------------------------

    def report_wait(self, token_digest: str) -> float | None:
        """Takes one report of this completion token's allowance (per minute, this replica);
        the seconds to wait when none is left."""
        return self._reports.take_if_any(token_digest)
