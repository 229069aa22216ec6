"""A claim whose answer is lost (the connection dies around its commit: a failover, a server
restart) leased jobs to a scheduler that never saw them. Before, they waited out the whole
job lease (60 s by default) for the reaper; now the scheduler hands them back at its next
pass and delivers them, while a job it did see (a POST may have been made) keeps its lease."""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any, NoReturn

import pytest
from sqlalchemy import select
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.services.scheduler import Scheduler
from app.store import claims
from app.store.claims import job_claim_batch
from app.store.tables import jobs, runs
from tests.conftest import TEST_KEY_RING
from tests.factories import make_jobs, make_tenant_and_target
from tests.receiver import Receiver, wait_for

pytestmark = pytest.mark.e2e


async def job_rows(engine: AsyncEngine, ids: list[uuid.UUID]) -> dict[uuid.UUID, tuple[str, str | None]]:
    async with engine.connect() as conn:
        rows = await conn.execute(select(jobs.c.id, jobs.c.state, jobs.c.lease_owner).where(jobs.c.id.in_(ids)))
        return {row.id: (row.state.value, row.lease_owner) for row in rows}


async def test_what_an_unanswered_claim_leased_is_handed_back_and_delivered_once(
    engine: AsyncEngine, scheduler: Scheduler, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    tenant, target = await make_tenant_and_target(engine, receiver.url())
    owner = scheduler.config.replica_id
    # A job this replica saw in an answered claim, whose outcome it has not recorded (its POST
    # may have been made): only the reaper may decide about it, once its lease ends.
    (seen,) = await make_jobs(engine, tenant, target, 1)
    async with engine.connect() as conn:
        await conn.execution_options(isolation_level="AUTOCOMMIT")
        answered = await job_claim_batch(conn, TEST_KEY_RING, owner, 10, scheduler.config.lease_s)
    assert [job.id for job in answered.jobs] == [seen]
    scheduler.claim_answers.answered(answered)

    # The lost answer: the claim commits, then its connection dies before the rows arrive.
    lost = await make_jobs(engine, tenant, target, 5)
    real_claim = claims.job_claim_batch

    async def claim_then_lose_the_answer(conn: AsyncConnection, *args: Any, **kwargs: Any) -> NoReturn:
        await real_claim(conn, *args, **kwargs)
        raise OperationalError("claim", None, ConnectionResetError("connection lost after the commit"))

    import app.services.scheduler as scheduler_module

    with monkeypatch.context() as patch:
        patch.setattr(scheduler_module, "job_claim_batch", claim_then_lose_the_answer)
        try:
            await scheduler.run_once()
        except OperationalError:
            pass
        else:
            raise AssertionError("the claim's failure must reach the service loop (backoff, outage log)")
    assert all(state == ("running", owner) for state in (await job_rows(engine, lost)).values())

    # The next pass hands them back, claims them again and delivers each once.
    await scheduler.run_once()
    await wait_for(lambda: len(receiver.requests) >= len(lost), timeout=30, message="the lost claim's jobs delivered")
    await scheduler.run_once()  # nothing left to claim; outcomes recorded
    states = await job_rows(engine, [*lost, seen])
    assert {job: states[job][0] for job in lost} == dict.fromkeys(lost, "succeeded")
    assert states[seen] == ("running", owner)  # untouched: its lease is its own
    delivered = Counter(receiver.webhook_ids())
    assert len(delivered) == len(lost) and set(delivered.values()) == {1}
    async with engine.connect() as conn:
        attempts = (await conn.execute(select(runs.c.attempt).where(runs.c.job_id.in_(lost)))).scalars().all()
    # Handed back uncounted: the delivery is each job's first attempt.
    assert sorted(attempts) == [1] * len(lost)
