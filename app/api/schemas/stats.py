"""Delivery statistics: what the console's overview draws (README: Console)."""

from __future__ import annotations

import datetime as dt
import uuid

from pydantic import BaseModel, Field


class DeliveryBucket(BaseModel):
    at: dt.datetime = Field(description="The bucket's start")
    delivered: int = Field(description="Attempts that succeeded")
    failed: int = Field(description="Attempts that failed (an error status, a timeout, a refused address...)")
    lateness_p50_ms: float | None = Field(description="Median lateness of first attempts; null without any")
    lateness_p99_ms: float | None


class DeliveryTotals(BaseModel):
    delivered: int
    failed: int
    lateness_p50_ms: float | None = Field(
        description="Lateness: a first attempt's start after the time it was due to fire; null without any"
    )
    lateness_p95_ms: float | None
    lateness_p99_ms: float | None


class BusyTarget(BaseModel):
    target_id: uuid.UUID
    name: str | None = Field(description="Null once the target is deleted")
    attempts: int
    failed: int


class DeliveryStats(BaseModel):
    now: dt.datetime = Field(description="The database's clock, which the window ends at")
    window: str
    bucket_s: int
    buckets: list[DeliveryBucket] = Field(description="Oldest first; a bucket without attempts is absent")
    totals: DeliveryTotals
    busiest_targets: list[BusyTarget] = Field(description="By attempts in the window, most first")
