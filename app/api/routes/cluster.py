"""Operator view of the scheduler cluster (admin key): live replicas, their partitions and lag."""

from __future__ import annotations

import datetime as dt

from fastapi import APIRouter

from app.api.deps import Admin, Conn
from app.api.schemas.operations import ClusterPartition, ClusterReplica, ClusterStatus
from app.store.partitions import cluster_view

router = APIRouter(prefix="/v1/cluster", tags=["cluster"])


def _oldest(times: list[dt.datetime | None]) -> dt.datetime | None:
    present = [t for t in times if t is not None]
    return min(present) if present else None


@router.get("", operation_id="getCluster", dependencies=[Admin])
async def get_cluster(conn: Conn) -> ClusterStatus:
    view = await cluster_view(conn)
    live_ids = {replica_id for replica_id, *_ in view.replicas}
    replicas = []
    for replica_id, started_at, heartbeat_at, expires_at in view.replicas:
        owned = [p for p in view.partitions if p.live and p.owner == replica_id]
        oldest = _oldest([p.oldest_due_at for p in owned])
        replicas.append(
            ClusterReplica(
                id=replica_id,
                started_at=started_at,
                heartbeat_at=heartbeat_at,
                expires_at=expires_at,
                partition_count=len(owned),
                partitions=[
                    ClusterPartition(partition=p.partition, epoch=p.epoch, expires_at=p.expires_at)
                    for p in owned
                    if p.expires_at
                ],
                oldest_due_at=oldest,
                lag_s=max(0.0, (view.now - oldest).total_seconds()) if oldest else 0.0,
            )
        )
    unowned = [p for p in view.partitions if not (p.live and p.owner in live_ids)]
    return ClusterStatus(
        now=view.now,
        partition_count=len(view.partitions),
        replicas=replicas,
        unowned_partitions=[p.partition for p in unowned],
        unowned_oldest_due_at=_oldest([p.oldest_due_at for p in unowned]),
    )
