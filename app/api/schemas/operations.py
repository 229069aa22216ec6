"""Operator views: health probes and the scheduler cluster."""

from __future__ import annotations

import datetime as dt
from typing import Literal

from pydantic import BaseModel, Field


class Health(BaseModel):
    status: Literal["ok"]


class Readiness(BaseModel):
    status: Literal["ready", "unavailable"]
    database: bool
    schema_current: bool
    reason: str | None = Field(
        default=None,
        description="Why the service is unavailable (e.g. the database refuses connections); null when ready.",
    )


class ClusterPartition(BaseModel):
    partition: int
    epoch: int = Field(description="Rises by one on every acquisition of the partition.")
    expires_at: dt.datetime


class ClusterReplica(BaseModel):
    id: str
    started_at: dt.datetime
    heartbeat_at: dt.datetime
    expires_at: dt.datetime
    partition_count: int
    partitions: list[ClusterPartition]
    oldest_due_at: dt.datetime | None = Field(
        description="The oldest due, unclaimed job in this replica's partitions; null when none is waiting."
    )
    lag_s: float = Field(description="Seconds since `oldest_due_at` (0 when nothing is waiting).")


class ClusterStatus(BaseModel):
    now: dt.datetime = Field(description="The database's clock, which every lease is measured against.")
    partition_count: int
    replicas: list[ClusterReplica]
    unowned_partitions: list[int] = Field(description="Partitions with no live owner (being taken over).")
    unowned_oldest_due_at: dt.datetime | None
