"""Schedule previews: the fire times a cron expression will have."""

from __future__ import annotations

import datetime as dt

from pydantic import BaseModel, Field


class FireTime(BaseModel):
    at: dt.datetime = Field(description="Local time in the schedule's zone, with its UTC offset")
    utc: dt.datetime
    utc_offset: str = Field(description="e.g. +02:00")


class SchedulePreview(BaseModel):
    cron: str = Field(
        description="The expression the fire times follow: normalised (aliases expanded), hashed values (`H`) "
        "resolved with the seed"
    )
    timezone: str
    fire_times: list[FireTime]
