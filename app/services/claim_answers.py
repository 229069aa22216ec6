"""A scheduler's claims whose answers were lost, and what they leased.

A claim is one statement that commits on the server; when the connection dies around that
commit (a failover, a restart), the jobs it leased belong to this replica, which never saw
them, until their lease ends (60 s by default). No POST was made for them, so they are handed
back at once, before the next claim (app/store/lease_writes.py, job_release_unanswered_claim).
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Iterable

from app.db.async_engine import AsyncEngine
from app.db.errors import is_transient_db_error
from app.logs import log_event
from app.store.claims import ClaimBatch
from app.store.lease_writes import job_release_unanswered_claim

logger = logging.getLogger("app.services.scheduler")


class ClaimAnswers:
    """The last answered claim's database time, and whether a claim failed since with its
    answer lost."""

    def __init__(self, engine: AsyncEngine, owner: str, lease_s: float, ahead_s: float = 0.0) -> None:
        self._engine = engine
        self._owner = owner
        self._lease_s = lease_s
        self._ahead_s = ahead_s
        self.answered_db_now: dt.datetime | None = None
        self.lost = False

    def answered(self, batch: ClaimBatch) -> None:
        # The latest now() among the claim's transactions (a limited target's lease is a
        # second one): every lease this replica saw ends by this plus the lease.
        self.answered_db_now = max([batch.db_now, *(job.claimed_at for job in batch.jobs)])

    def failed(self, error: BaseException) -> None:
        """An outage under a claim: its answer is lost, not proof that nothing was claimed."""
        if is_transient_db_error(error):
            self.lost = True

    async def release_lost(self, in_flight: Iterable[uuid.UUID]) -> None:
        """Hands back what a lost answer leased. Before any answered claim there is no bound
        telling its jobs from an earlier life's under the same replica id, whose POSTs may
        have been made: those stay with the reaper."""
        if self.answered_db_now is not None:
            async with self._engine.begin() as conn:
                released = await job_release_unanswered_claim(
                    conn, self._owner, self.answered_db_now, self._lease_s, list(in_flight), self._ahead_s
                )
            if released:
                log_event(logger, "unanswered_claim_released", logging.WARNING, released=released)
        self.lost = False
