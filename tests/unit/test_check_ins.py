"""Inbound check-ins' pure rules (app/domain/check_ins.py): when a ping is due and a check
goes down, what each ping kind does to a check, which pings are edges to report, schedule
validation naming the field, and what is kept of a ping's body."""

from __future__ import annotations

import datetime as dt

import pytest

from app.domain.check_ins import (
    PING_BODY_CHARS,
    CheckSchedule,
    CheckState,
    CheckStatus,
    PingKind,
    after_ping,
    changed_schedule,
    check_schedule,
    deadlines_after,
    kept_body,
    new_ping_token,
    ping_url,
    rescheduled,
)
from app.domain.events import EventType
from app.domain.schedule import ScheduleError

NOW = dt.datetime(2026, 3, 7, 12, 0, 30, tzinfo=dt.UTC)
HOURLY = CheckSchedule(every_s=3600)
S = CheckStatus


def state(status: CheckStatus, schedule: CheckSchedule = HOURLY, started: dt.datetime | None = None) -> CheckState:
    return CheckState(schedule, grace_s=300, status=status, next_due_at=NOW, last_started_at=started)


def test_a_new_check_is_due_one_period_after_its_creation_and_goes_down_a_grace_later() -> None:
    deadlines = deadlines_after(HOURLY, 300, NOW)
    assert deadlines.next_due_at == NOW + dt.timedelta(hours=1)
    assert deadlines.alert_at == NOW + dt.timedelta(hours=1, minutes=5)


@pytest.mark.parametrize(
    ("cron", "zone", "after", "due"),
    [
        # The first fire time after the ping, not one period after it.
        ("0 2 * * *", "UTC", NOW, dt.datetime(2026, 3, 8, 2, 0, tzinfo=dt.UTC)),
        ("*/15 * * * *", "UTC", NOW, dt.datetime(2026, 3, 7, 12, 15, tzinfo=dt.UTC)),
        # In the check's zone: 02:30 New York does not exist on 2026-03-08, it fires at 03:00 EDT.
        ("30 2 * * *", "America/New_York", NOW, dt.datetime(2026, 3, 8, 7, 0, tzinfo=dt.UTC)),
        # A ping right at a fire time is that run's: the next is due at the next fire time.
        (
            "0 * * * *",
            "UTC",
            dt.datetime(2026, 3, 7, 12, 0, tzinfo=dt.UTC),
            dt.datetime(2026, 3, 7, 13, 0, tzinfo=dt.UTC),
        ),
    ],
)
def test_a_cron_check_is_due_at_the_next_fire_time_after_its_ping(
    cron: str, zone: str, after: dt.datetime, due: dt.datetime
) -> None:
    schedule = check_schedule(None, cron, zone, NOW)
    deadlines = deadlines_after(schedule, 60, after)
    assert (deadlines.next_due_at, deadlines.alert_at) == (due, due + dt.timedelta(seconds=60))


@pytest.mark.parametrize("status", [S.NEW, S.UP, S.STARTED])
def test_a_success_ping_makes_the_check_up_without_an_event_unless_it_was_down(status: CheckStatus) -> None:
    outcome = after_ping(state(status), PingKind.SUCCESS, NOW)
    assert outcome.status == S.UP and outcome.event is None
    assert outcome.deadlines == deadlines_after(HOURLY, 300, NOW)
    assert outcome.last_started_at is None


def test_a_success_ping_brings_a_down_check_up_once() -> None:
    outcome = after_ping(state(S.DOWN), PingKind.SUCCESS, NOW)
    assert (outcome.status, outcome.event) == (S.UP, EventType.CHECK_UP)


@pytest.mark.parametrize("status", [S.NEW, S.UP, S.STARTED])
def test_a_fail_ping_makes_the_check_down_and_reports_it(status: CheckStatus) -> None:
    outcome = after_ping(state(status), PingKind.FAIL, NOW)
    assert (outcome.status, outcome.event) == (S.DOWN, EventType.CHECK_DOWN)
    # When the next ping is expected still follows from this one.
    assert outcome.deadlines.next_due_at == NOW + dt.timedelta(hours=1)


def test_a_fail_ping_on_a_down_check_reports_nothing_more() -> None:
    outcome = after_ping(state(S.DOWN), PingKind.FAIL, NOW)
    assert (outcome.status, outcome.event) == (S.DOWN, None)


@pytest.mark.parametrize("status", [S.NEW, S.UP, S.STARTED])
def test_a_start_ping_gives_the_run_its_grace_and_keeps_the_due_time(status: CheckStatus) -> None:
    outcome = after_ping(state(status), PingKind.START, NOW)
    assert (outcome.status, outcome.event, outcome.last_started_at) == (S.STARTED, None, NOW)
    assert outcome.deadlines.alert_at == NOW + dt.timedelta(seconds=300)
    assert outcome.deadlines.next_due_at == NOW


def test_a_start_ping_does_not_bring_a_down_check_up() -> None:
    """Only a success says the job works again: a down is always followed by one up."""
    outcome = after_ping(state(S.DOWN), PingKind.START, NOW)
    assert (outcome.status, outcome.event, outcome.last_started_at) == (S.DOWN, None, NOW)
    ended = after_ping(state(S.DOWN, started=NOW), PingKind.SUCCESS, NOW + dt.timedelta(seconds=42))
    assert (ended.status, ended.event, ended.duration_ms) == (S.UP, EventType.CHECK_UP, 42_000)


@pytest.mark.parametrize("kind", [PingKind.SUCCESS, PingKind.FAIL])
def test_the_end_of_a_started_run_says_how_long_it_took(kind: PingKind) -> None:
    started = NOW - dt.timedelta(seconds=12, milliseconds=345)
    assert after_ping(state(S.STARTED, started=started), kind, NOW).duration_ms == 12_345
    # Without a start, no duration.
    assert after_ping(state(S.UP), kind, NOW).duration_ms is None


def test_each_edge_is_reported_once_through_a_sequence_of_pings() -> None:
    current = state(S.NEW)
    events = []
    for kind in [PingKind.SUCCESS, PingKind.FAIL, PingKind.FAIL, PingKind.START, PingKind.SUCCESS, PingKind.SUCCESS]:
        outcome = after_ping(current, kind, NOW)
        events.append(outcome.event)
        current = CheckState(
            HOURLY, 300, outcome.status, outcome.deadlines.next_due_at, last_started_at=outcome.last_started_at
        )
    assert events == [None, EventType.CHECK_DOWN, None, None, EventType.CHECK_UP, None]


def test_a_changed_check_counts_from_its_last_ping_or_its_creation() -> None:
    created = NOW - dt.timedelta(hours=3)
    pinged = NOW - dt.timedelta(minutes=10)
    daily = CheckSchedule(every_s=86_400)
    never_pinged = rescheduled(daily, 60, status=S.NEW, last_ping_at=None, last_started_at=None, created_at=created)
    assert never_pinged.next_due_at == created + dt.timedelta(days=1)
    up = rescheduled(daily, 60, status=S.UP, last_ping_at=pinged, last_started_at=None, created_at=created)
    assert (up.next_due_at, up.alert_at) == (pinged + dt.timedelta(days=1), pinged + dt.timedelta(days=1, seconds=60))
    # A run under way must still end within the (new) grace of its start.
    started = rescheduled(daily, 60, status=S.STARTED, last_ping_at=pinged, last_started_at=pinged, created_at=created)
    assert started.alert_at == pinged + dt.timedelta(seconds=60)


@pytest.mark.parametrize(
    ("every_s", "cron", "timezone", "field"),
    [
        (None, None, None, "every_s"),
        (60, "* * * * *", None, "cron"),
        (60, None, "Europe/Paris", "timezone"),
        (None, "61 * * * *", None, "cron"),
        (None, "* * * * *", "Mars/Olympus", "timezone"),
        # H values are hashed from a job; a check names the times its job runs at.
        (None, "H 2 * * *", None, "cron"),
    ],
)
def test_a_bad_schedule_names_its_field(
    every_s: int | None, cron: str | None, timezone: str | None, field: str
) -> None:
    with pytest.raises(ScheduleError) as refused:
        check_schedule(every_s, cron, timezone, NOW)
    assert refused.value.field == field


def test_a_change_replaces_the_schedule_or_its_zone() -> None:
    paris = check_schedule(None, "0 2 * * *", "Europe/Paris", NOW)
    assert changed_schedule(paris, None, None, None, NOW) == paris
    # A new expression keeps the zone; a zone alone changes only the zone.
    assert changed_schedule(paris, None, "0 3 * * *", None, NOW) == CheckSchedule(None, "0 3 * * *", "Europe/Paris")
    assert changed_schedule(paris, None, None, "Asia/Tokyo", NOW) == CheckSchedule(None, "0 2 * * *", "Asia/Tokyo")
    assert changed_schedule(paris, 600, None, None, NOW) == CheckSchedule(every_s=600)
    assert changed_schedule(HOURLY, None, "0 2 * * *", None, NOW) == CheckSchedule(None, "0 2 * * *", "UTC")
    with pytest.raises(ScheduleError) as refused:
        changed_schedule(HOURLY, None, None, "Asia/Tokyo", NOW)
    assert refused.value.field == "timezone"


def test_ping_tokens_are_unguessable_and_urls_start_at_the_public_address() -> None:
    tokens = {new_ping_token() for _ in range(1000)}
    assert len(tokens) == 1000 and all(len(token) >= 32 for token in tokens)
    token = new_ping_token()
    assert ping_url("https://cron.example.com/", token) == f"https://cron.example.com/v1/checks/ping/{token}"


def test_a_pings_body_is_kept_as_storable_text_and_cut() -> None:
    assert kept_body(b"") is None
    assert kept_body(b"backup done\n") == "backup done\n"
    assert kept_body(b"a\x00b\xffc") == "ab\ufffdc"
    long = ("é" * (PING_BODY_CHARS + 500)).encode()
    assert kept_body(long) == "é" * PING_BODY_CHARS
