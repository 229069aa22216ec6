"""Inbound check-ins: a dead-man's switch for a cron cronhook does not run (a backup script,
a Kubernetes CronJob). Pure rules, `now` always passed in; the store keeps a check's state
(app/store/check_ins.py) and the reaper's check watch (app/services/check_watch.py) moves
overdue checks down.

A check expects a ping every `every_s` seconds, or at each fire time of `cron` in
`timezone`. Its clock starts when it is created and starts again at each ping:

- a success ping: `up`; the next ping is due one period after it (every_s), or at the
  first cron fire time after it (next_due_at), and the check goes down `grace_s` after that
  (alert_at);
- a start ping: `started`; the run must end (a success or fail ping) within grace_s;
- a fail ping: `down` at once;
- no ping by alert_at: `down` (the check watch).

Each edge between down and not down is reported once: check.down when the check goes down,
check.up when a success ping brings it back. A start ping does not bring a down check back:
it stays down until its run's success ping says the job works again, so a down is always
followed by an up before the next down.

The ping URL's token is 192 random bits; only its SHA-256 is stored (token_digest).
"""

from __future__ import annotations

import datetime as dt
import enum
import secrets
from dataclasses import dataclass

from app.domain.cron_hash import has_hash
from app.domain.events import EventType
from app.domain.schedule import CronSchedule, ScheduleError, next_cron_fire, validate_cron

# A period or grace longer than a leap year is surely a mistake.
MAX_EVERY_S = 366 * 86_400
MAX_GRACE_S = 366 * 86_400
# What is kept of a ping's body (a script's last lines of output).
PING_BODY_CHARS = 1_000
TOKEN_PREFIX = "ckp_"
_TOKEN_BYTES = 24


class CheckStatus(enum.StrEnum):
    # Created, never pinged (its clock runs from its creation).
    NEW = "new"
    UP = "up"
    # Overdue past its grace (the check watch), or a fail ping; back up at a success ping.
    DOWN = "down"
    # A start ping came and its run's end (a success or fail ping) has not.
    STARTED = "started"


class PingKind(enum.StrEnum):
    SUCCESS = "success"
    START = "start"
    FAIL = "fail"


@dataclass(frozen=True)
class CheckSchedule:
    """When pings are expected: every `every_s` seconds, or on `cron` in `timezone`."""

    every_s: int | None = None
    cron: str | None = None
    timezone: str = "UTC"

    def next_due(self, after: dt.datetime) -> dt.datetime:
        """When the ping after one at `after` is due."""
        if self.every_s is not None:
            return after + dt.timedelta(seconds=self.every_s)
        assert self.cron is not None
        return next_cron_fire(CronSchedule(self.cron, self.timezone), after)


def check_schedule(every_s: int | None, cron: str | None, timezone: str | None, now: dt.datetime) -> CheckSchedule:
    """A new check's schedule from its fields; ScheduleError names the field at fault."""
    if every_s is not None and cron is not None:
        raise ScheduleError("cron", "give every_s or cron, not both")
    if every_s is None and cron is None:
        raise ScheduleError("every_s", "a schedule is required: every_s, or cron (with timezone)")
    if every_s is not None:
        if timezone is not None:
            raise ScheduleError("timezone", "timezone applies only to a cron schedule")
        return CheckSchedule(every_s=every_s)
    assert cron is not None
    return _cron_schedule(cron, timezone or "UTC", now)


def changed_schedule(
    current: CheckSchedule, every_s: int | None, cron: str | None, timezone: str | None, now: dt.datetime
) -> CheckSchedule:
    """The schedule after a change of some of its fields: every_s or cron replaces the other;
    a timezone alone changes a cron schedule's zone."""
    if every_s is not None or cron is not None:
        if cron is not None and timezone is None and current.cron is not None:
            timezone = current.timezone  # a new expression keeps its zone
        return check_schedule(every_s, cron, timezone, now)
    if timezone is None:
        return current
    if current.cron is None:
        raise ScheduleError("timezone", "timezone applies only to a cron schedule")
    return _cron_schedule(current.cron, timezone, now)


def _cron_schedule(cron: str, timezone: str, now: dt.datetime) -> CheckSchedule:
    if has_hash(cron):
        # A job's H values are hashed from the job; a check names the times its job runs at.
        raise ScheduleError("cron", "hashed values (H) are for jobs: give the times the checked job runs at")
    validate_cron(cron, timezone, now)  # also refuses an unknown zone
    return CheckSchedule(cron=cron, timezone=timezone)


@dataclass(frozen=True)
class CheckState:
    """What a ping's outcome depends on."""

    schedule: CheckSchedule
    grace_s: int
    status: CheckStatus
    next_due_at: dt.datetime
    last_started_at: dt.datetime | None


@dataclass(frozen=True)
class Deadlines:
    next_due_at: dt.datetime
    alert_at: dt.datetime


@dataclass(frozen=True)
class PingOutcome:
    status: CheckStatus
    deadlines: Deadlines
    last_started_at: dt.datetime | None
    # A success or fail ping ending a started run: how long it ran.
    duration_ms: int | None
    # The edge this ping makes, to report (None: no edge).
    event: EventType | None


def deadlines_after(schedule: CheckSchedule, grace_s: int, anchor: dt.datetime) -> Deadlines:
    """The next ping is due one period after `anchor` (a ping, or the check's creation);
    the check goes down grace_s after that."""
    due = schedule.next_due(anchor)
    return Deadlines(due, due + dt.timedelta(seconds=grace_s))


def rescheduled(
    schedule: CheckSchedule,
    grace_s: int,
    *,
    status: CheckStatus,
    last_ping_at: dt.datetime | None,
    last_started_at: dt.datetime | None,
    created_at: dt.datetime,
) -> Deadlines:
    """A changed check's deadlines, from its last ping (or its creation) under its new
    schedule and grace; a started run must still end within grace_s of its start."""
    deadlines = deadlines_after(schedule, grace_s, last_ping_at or created_at)
    if status == CheckStatus.STARTED and last_started_at is not None:
        return Deadlines(deadlines.next_due_at, last_started_at + dt.timedelta(seconds=grace_s))
    return deadlines


def after_ping(check: CheckState, kind: PingKind, now: dt.datetime) -> PingOutcome:
    """The check once a ping of `kind` arrived at `now`."""
    was_down = check.status == CheckStatus.DOWN
    running_since = check.last_started_at if check.status in (CheckStatus.STARTED, CheckStatus.DOWN) else None
    if kind == PingKind.START:
        # The run must end within the grace; a down check stays down until its success ping.
        grace_end = now + dt.timedelta(seconds=check.grace_s)
        status = CheckStatus.DOWN if was_down else CheckStatus.STARTED
        return PingOutcome(status, Deadlines(check.next_due_at, grace_end), now, None, None)
    duration_ms = None if running_since is None else max(0, int((now - running_since).total_seconds() * 1000))
    deadlines = deadlines_after(check.schedule, check.grace_s, now)
    if kind == PingKind.FAIL:
        return PingOutcome(CheckStatus.DOWN, deadlines, None, duration_ms, None if was_down else EventType.CHECK_DOWN)
    return PingOutcome(CheckStatus.UP, deadlines, None, duration_ms, EventType.CHECK_UP if was_down else None)


def new_ping_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(_TOKEN_BYTES)


def ping_url(base_url: str, token: str) -> str:
    """The check's ping URL under the API's public address (CRONHOOK_PUBLIC_URL, as an async
    delivery's completion URL); /start and /fail are appended for those pings."""
    return f"{base_url.rstrip('/')}/v1/checks/ping/{token}"


def kept_body(raw: bytes) -> str | None:
    """What is kept of a ping's body: its first PING_BODY_CHARS characters, as text
    PostgreSQL can store (invalid UTF-8 replaced, NULs dropped); None when empty."""
    text = raw[: PING_BODY_CHARS * 4].decode("utf-8", errors="replace").replace("\x00", "")
    return text[:PING_BODY_CHARS] or None
