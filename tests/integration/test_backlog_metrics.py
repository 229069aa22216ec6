"""The per-replica backlog gauges: due jobs in owned partitions, apart from those a target's
limits hold back on purpose."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
from sqlalchemy import func, update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.partition import PARTITION_COUNT, partition_for
from app.metrics import exposition, sample_value
from app.services.backlog import BacklogSample, BacklogSampler
from app.store.tables import targets
from tests.conftest import make_job, make_target


class AllPartitions:
    replica_id = "backlog-test"

    def __init__(self, partitions: list[int]) -> None:
        self.partitions = partitions

    def held(self) -> dict[int, int]:
        return dict.fromkeys(self.partitions, 1)


def _gauge(name: str) -> float:
    return sample_value(exposition()[0].decode(), name, {"replica": "backlog-test"})


async def test_backlog_counts_due_jobs_and_held_back_ones_apart(
    client: httpx.AsyncClient, auth: dict[str, str], engine: AsyncEngine
) -> None:
    free = await make_target(client, auth, "http://127.0.0.1:9/free")
    limited = await make_target(client, auth, "http://127.0.0.1:9/limited", rate_per_s=0.001)
    async with engine.begin() as conn:  # its token bucket is empty: nothing may start now
        await conn.execute(
            update(targets).where(targets.c.id == limited["id"]).values(rate_tokens=0, rate_updated_at=func.now())
        )
    past = "2020-01-01T00:00:00Z"
    due: list[dict[str, Any]] = [await make_job(client, auth, free["id"], run_at=past) for _ in range(3)]
    for _ in range(2):
        await make_job(client, auth, limited["id"], run_at=past)
    await make_job(client, auth, free["id"], delay_s=3600)  # not due

    sampler = BacklogSampler(engine, AllPartitions(list(range(PARTITION_COUNT))))
    assert await sampler.run_once() == BacklogSample(partitions=PARTITION_COUNT, due=3, held_back=2)
    assert (_gauge("cronhook_due_backlog"), _gauge("cronhook_due_held_back")) == (3, 2)
    assert _gauge("cronhook_oldest_due_age_seconds") > 3600  # due since 2020
    assert _gauge("cronhook_partitions_owned") == PARTITION_COUNT

    # Only the partitions this replica owns count: here, the first free job's.
    first = partition_for(uuid.UUID(due[0]["id"]))
    expected = sum(partition_for(uuid.UUID(job["id"])) == first for job in due)
    sample = await BacklogSampler(engine, AllPartitions([first])).run_once()
    assert sample.due == expected and _gauge("cronhook_due_backlog") == expected
    assert _gauge("cronhook_partitions_owned") == 1
