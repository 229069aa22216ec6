"""The job lifecycle as a Hypothesis state machine, on a real PostgreSQL.

Rules drive jobs through the code the service runs: two scheduler replicas, each with its
real partition ownership (rounds that acquire, renew and shed partitions under epochs; a
replica whose partition leases lapse is taken over and its claims are fenced), claims with
the replica's possibly stale view of what it owns, deliveries through the scheduler's own
path (trust check, misfire settling, a real POST to a receiver on 127.0.0.1, the retry
decision, the group-commit recorder), the reaper, and through the HTTP API: create
(one-off and recurring, with max_runs), pause, resume, PATCH, trigger, cancel and
dead-letter replay; and asynchronous completion (jobs in `async` mode: a 202 leaves the
attempt open, the receiver heartbeats and reports succeeded, failed or retry on the
completion URL, late reports on a token whose attempt has ended are refused 409 or 410, and
the reaper fails attempts whose heartbeat deadline or deadline passed). After every step the
database is checked against a small model, and against invariants that must hold whatever
the interleaving: leases, attempts, terminal states, dead letters, runs, recurring fire
times on their grid, max_runs, partition epochs.
The test gets its own database from the `db_url` fixture; each example empties it and runs
on its own event loop, since the rules are synchronous.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import random
import time
import uuid
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test
from sqlalchemy import case, func, select, text, update
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import QueuePool

from app.api.app import create_app
from app.db.engine import create_engine
from app.domain.completion import ASYNC_OWNER, read_token
from app.domain.egress import parse_egress_allow
from app.domain.job import ClaimedJob
from app.domain.partition import PARTITION_COUNT
from app.domain.states import CANCELLABLE_STATES, CLAIMABLE_STATES, TERMINAL_STATES, JobState
from app.services.reaper import Reaper, ReaperConfig
from app.services.scheduler import Scheduler
from app.services.scheduler_config import SchedulerConfig
from app.settings import Settings
from app.store.claims import job_claim_due
from app.store.jobs import db_now, job_cancel
from app.store.tables import dead_letters, jobs, partition_leases, replicas, runs
from app.store.tenants import api_key_create, tenant_ensure
from tests.conftest import LOOPBACK_ALLOWED, TEST_KEY_RING
from tests.factories import expire_leases, make_tenant_and_target
from tests.receiver import Receiver, Reply

T = TypeVar("T")

# Long enough never to expire by itself during an example: only `expire_lease` expires one.
LEASE_S = 300.0
# Partition leases and the replicas' trust in them outlast an example too: only `lapse` ends them.
PARTITION_LEASE_S = 300.0
PARTITION_RENEW_S = 60.0
# Recurring jobs fire hourly: a next occurrence is due only once `make_due` moves it.
EVERY_S = 3600
# Few jobs, many steps each: the interesting paths are deep (attempts, leases, replays).
MAX_JOBS = 6
REPLICAS = ("replica-a", "replica-b")
# What the receiver answers, per outcome the rule picks.
REPLIES = {
    "success": Reply(status=200),
    "unavailable": Reply(status=503),
    # Retry-After holds the retry back an hour: not due until `make_due`.
    "throttled": Reply(status=429, headers={"Retry-After": "3600"}),
    "rejected": Reply(status=404),
    # An async job's attempt stays open (awaiting its receiver's report); a sync job's succeeds.
    "accepted": Reply(status=202, body=b""),
}
# What a receiver reports on an open attempt, and the delivery outcome it stands for in the
# model: `failed` is final (as a 404), `retry` retries (as a 503), or after an hour (as a 429).
REPORTS: dict[str, tuple[dict[str, Any], str]] = {
    "succeeded": ({"outcome": "succeeded", "result": {"ok": True}}, "success"),
    "failed": ({"outcome": "failed", "error": "the work failed"}, "rejected"),
    "retry": ({"outcome": "retry"}, "unavailable"),
    "retry_later": ({"outcome": "retry", "retry_after_s": 3600}, "throttled"),
}
# Runs of attempts no scheduler held at their end: reported on, timed out, or cancelled open.
ASYNC_RUN_OUTCOMES = ("success", "failed", "heartbeat_timeout", "async_timeout", "cancelled")
# Indexes into the machine's lists, taken modulo their length (they shrink towards 0).
picks = st.integers(min_value=0, max_value=63)
# The keys the machine's named schedules use (few, so PUTs meet their own jobs again).
NAMED_KEYS = ["alpha", "beta"]


@dataclass
class Lease:
    """A claim as the replica that made it remembers it."""

    job: ClaimedJob
    replica: str
    epoch: int  # the epoch under which the replica held the job's partition at the claim
    claimed_mono: float


@dataclass
class JobModel:
    """What the test expects of one job; the database is checked against it after each step."""

    id: uuid.UUID
    recurring: bool
    max_attempts: int
    max_runs: int | None = None
    state: JobState = JobState.SCHEDULED
    due: bool = False  # waiting, with run_at in the past
    fire_passed: bool = False  # the current occurrence's nominal fire time has passed
    attempt: int = 0  # attempts made for the current occurrence
    lease: Lease | None = None  # the current lease, while running
    lease_expired: bool = False
    claims: int = 0  # attempts started, over all occurrences
    runs: int = 0  # attempts recorded, by their scheduler or by the reaper
    dead_letters: int = 0  # occurrences dead-lettered
    occurrences: int = 0  # occurrences ended (delivered or dead-lettered)
    ended: bool = False  # a recurring job that reached max_runs
    is_async: bool = False  # completion "async" (the job's own setting)
    token_path: str | None = None  # while an attempt is open (202): its completion path
    progress: int | None = None  # of the open attempt, as last reported
    # An open attempt past a deadline (expire_lease or time_runs_out): what the reaper records.
    timeout: str | None = None
    # Paused while its attempt was open: paused when the attempt ends (if it then waits).
    pause_requested: bool = False
    # A named schedule (PUT /v1/schedules/{key}): its key, and its definition as last put or
    # changed (the payload's version, and the priority a PATCH may have set).
    key: str | None = None
    version: int = 0
    priority: int = 0

    @property
    def awaiting(self) -> bool:
        return self.token_path is not None

    def next_after(self, outcome: str) -> tuple[JobState, bool, bool]:
        """(state, dead-lettered, due) once the current attempt ends with `outcome`;
        "lease_expired" when the reaper ends it."""
        failed = outcome != "success"
        if failed and outcome != "rejected" and self.attempt < self.max_attempts:
            return JobState.RETRYING, False, outcome != "throttled"  # the backoff is (about) zero
        if self.recurring:
            if self.max_runs is not None and self.occurrences + 1 >= self.max_runs:
                # Past its bounds a recurring job ends succeeded (README), even when its last
                # occurrence was dead-lettered.
                return JobState.SUCCEEDED, failed, False
            return JobState.SCHEDULED, failed, False  # the next occurrence, an hour out
        return (JobState.DEAD if failed else JobState.SUCCEEDED), failed, False

    def attempt_ended(self, state: JobState, dead_lettered: bool, due: bool) -> None:
        self.state, self.due, self.lease, self.lease_expired = state, due, None, False
        self.token_path, self.progress, self.timeout = None, None, None
        self.runs += 1
        self.dead_letters += dead_lettered
        if state != JobState.RETRYING:
            self.occurrences += 1
            self.attempt = 0 if state == JobState.SCHEDULED else self.attempt
            self.fire_passed = False
            self.ended = self.recurring and state in TERMINAL_STATES
        if self.pause_requested:
            self.pause_requested = False
            if state in (JobState.SCHEDULED, JobState.RETRYING):
                self.state, self.due = JobState.PAUSED, False


@dataclass(frozen=True)
class Snapshot:
    now: dt.datetime
    jobs: list[Row[Any]]
    runs: list[Row[Any]]
    dead_letters: list[Row[Any]]
    partitions: list[Row[Any]]

    def rows(self) -> tuple[list[Row[Any]], ...]:
        return self.jobs, self.runs, self.dead_letters


class LifecycleMachine(RuleBasedStateMachine):
    def __init__(self, db_url: str, stats: Counter[str]) -> None:
        super().__init__()
        self.stats = stats
        self.loop = asyncio.new_event_loop()
        self.engine: AsyncEngine | None = None
        self.client: httpx.AsyncClient | None = None
        # Receivers' reports on completion URLs: no API key.
        self.reports: httpx.AsyncClient | None = None
        self.receiver = Receiver()
        self.schedulers: dict[str, Scheduler] = {}
        self.models: dict[uuid.UUID, JobModel] = {}  # in creation order
        self.leases: list[Lease] = []  # every lease handed out
        self.terminal: dict[uuid.UUID, JobState] = {}  # first terminal state seen in the database
        self.partitions: dict[int, tuple[str | None, int]] = {}  # last seen owner and epoch
        self.occurrence_at: dict[uuid.UUID, dt.datetime] = {}  # recurring: fire time of the last occurrence
        # Completion paths of async attempts that have ended: whether their receiver finished
        # them (a late report is then a 409; else a 410).
        self.ended_tokens: dict[str, bool] = {}
        try:
            self.run(self._start(db_url))
        except BaseException:
            self.teardown()
            raise

    async def _start(self, db_url: str) -> None:
        self.engine = create_engine(db_url, pool_size=4)
        async with self.engine.begin() as conn:
            # The previous example's rows: what a tenant owns goes with it; jobs and runs have no
            # foreign key to their owners (migrations 0013, 0014), so they are named too.
            await conn.execute(text("TRUNCATE tenants, replicas, jobs, runs CASCADE"))
            await conn.execute(update(partition_leases).values(owner=None, expires_at=None, epoch=0))
        await self.receiver.start()
        self.tenant_id, self.target_id = await make_tenant_and_target(self.engine, self.receiver.url(), timeout_s=2.0)
        async with self.engine.begin() as conn:
            key = await api_key_create(conn, self.tenant_id)
            self.other_tenant_id = await tenant_ensure(conn, "someone-else")
        # Retries due (about) at once need a backoff below the default per-tenant floor.
        settings = Settings(database_url=db_url, replica_id="stateful", tenant_min_backoff_base_s=0)
        app = create_app(settings, engine=self.engine)
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://cronhook.test",
            headers={"Authorization": f"Bearer {key}"},
        )
        self.reports = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://cronhook.test")
        for name in REPLICAS:
            config = SchedulerConfig(
                replica_id=name,
                lease_s=LEASE_S,
                max_target_timeout_s=3,
                lease_margin_s=1,
                partition_lease_s=PARTITION_LEASE_S,
                partition_renew_s=PARTITION_RENEW_S,
                # Only jobs already due: the model decides what a claim takes from the due
                # times alone, and a claim-ahead would make that depend on how fast each step
                # ran (tests/e2e/test_wakeups.py checks the claim-ahead itself).
                claim_ahead_s=0.0,
                # Deliveries go to the test receiver on loopback.
                egress=parse_egress_allow(LOOPBACK_ALLOWED),
            )
            self.schedulers[name] = Scheduler(self.engine, config, TEST_KEY_RING, rng=random.Random(0))
            await self.schedulers[name].start()
        # The first replica takes every partition; the other stands by.
        self.owner = REPLICAS[0]
        await self.schedulers[self.owner].ownership.run_once()

    def teardown(self) -> None:
        try:
            self.run(self._stop())
        finally:
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    async def _stop(self) -> None:
        try:
            for scheduler in self.schedulers.values():
                await scheduler.close(grace_s=5)
            await self.receiver.stop()
            if self.client is not None:
                await self.client.aclose()
            if self.reports is not None:
                await self.reports.aclose()
            if self.engine is not None:
                # A connection left checked out is a leak in the code under test.
                pool = self.engine.pool
                assert isinstance(pool, QueuePool)
                assert pool.checkedout() == 0, "a pooled connection was not returned"
        finally:
            if self.engine is not None:
                await self.engine.dispose()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def note(self, kind: str) -> None:
        """Counts what the examples exercised, so a rule that never fires is noticed."""
        self.stats[kind] += 1

    @property
    def db(self) -> AsyncEngine:
        assert self.engine is not None
        return self.engine

    @property
    def http(self) -> httpx.AsyncClient:
        assert self.client is not None
        return self.client

    @property
    def reporter(self) -> httpx.AsyncClient:
        assert self.reports is not None
        return self.reports

    # -- the model ---------------------------------------------------------------------

    def due(self) -> list[JobModel]:
        return [m for m in self.models.values() if m.state in CLAIMABLE_STATES and m.due]

    def running(self) -> list[JobModel]:
        return [m for m in self.models.values() if m.state == JobState.RUNNING]

    def delivering(self) -> list[JobModel]:
        """Running under a scheduler's lease (not yet answered)."""
        return [m for m in self.running() if not m.awaiting]

    def open_attempts(self) -> list[JobModel]:
        """Running with an attempt its receiver accepted (202): no scheduler holds it."""
        return [m for m in self.running() if m.awaiting]

    def is_current(self, lease: Lease) -> bool:
        current = self.models[lease.job.id].lease
        return current is not None and current.job.lease_token == lease.job.lease_token

    def stale_leases(self) -> list[Lease]:
        """Leases that were reaped, cancelled, released or already recorded."""
        return [lease for lease in self.leases if not self.is_current(lease)]

    # -- the database ------------------------------------------------------------------

    async def snapshot(self) -> Snapshot:
        async with self.db.connect() as conn:
            return Snapshot(
                now=await db_now(conn),
                jobs=list((await conn.execute(select(jobs).order_by(jobs.c.id))).all()),
                runs=list((await conn.execute(select(runs).order_by(runs.c.id))).all()),
                dead_letters=list((await conn.execute(select(dead_letters).order_by(dead_letters.c.id))).all()),
                partitions=list(
                    (
                        await conn.execute(
                            select(
                                partition_leases.c.partition,
                                partition_leases.c.owner,
                                partition_leases.c.epoch,
                                (partition_leases.c.expires_at > func.now()).label("live"),
                            )
                        )
                    ).all()
                ),
            )

    async def api(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return await self.http.request(method, path, **kwargs)

    # -- rules: jobs through the API ---------------------------------------------------

    @precondition(lambda self: len(self.models) < MAX_JOBS)
    @rule(
        recurring=st.booleans(),
        max_attempts=st.integers(1, 3),
        due=st.booleans(),
        max_runs=st.sampled_from([None, 1, 2]),
        async_mode=st.booleans(),
    )
    def create_job(self, recurring: bool, max_attempts: int, due: bool, max_runs: int | None, async_mode: bool) -> None:
        body: dict[str, Any] = {
            "target_id": str(self.target_id),
            "payload": {"n": len(self.models)},
            "max_attempts": max_attempts,
            # A retry is due (about) at once.
            "backoff_base_s": 0.001,
            "backoff_max_s": 0.001,
        }
        if recurring:
            body.update(every_s=EVERY_S, misfire_grace_s=86_400, max_runs=max_runs)
        else:
            body.update(delay_s=EVERY_S)
        if async_mode:
            # The target is sync: the job's own setting overrides it.
            body.update(completion="async")
        response = self.run(self.api("POST", "/v1/jobs", json=body))
        assert response.status_code == 201, response.text
        job_id = uuid.UUID(response.json()["id"])
        model = JobModel(job_id, recurring, max_attempts, max_runs if recurring else None, is_async=async_mode)
        self.models[job_id] = model
        if due:
            self.run(self._shift_into_past([job_id]))
            model.due = model.fire_passed = True

    async def _shift_into_past(self, ids: list[uuid.UUID]) -> None:
        """Time passes for these waiting jobs: each is due a second ago. A fresh occurrence moves
        with its whole grid (fire time and anchor); a retry just falls due."""
        fresh = jobs.c.attempt == 0
        delta = jobs.c.run_at - (func.now() - dt.timedelta(seconds=1))
        async with self.db.begin() as conn:
            await conn.execute(
                update(jobs)
                .where(jobs.c.id.in_(ids), jobs.c.state.in_([s.value for s in CLAIMABLE_STATES]))
                .values(
                    run_at=func.now() - dt.timedelta(seconds=1),
                    scheduled_for=case((fresh, jobs.c.scheduled_for - delta), else_=jobs.c.scheduled_for),
                    schedule_anchor_at=case(
                        (fresh, jobs.c.schedule_anchor_at - delta), else_=jobs.c.schedule_anchor_at
                    ),
                )
            )

    @precondition(lambda self: any(m.state in CLAIMABLE_STATES and not m.due for m in self.models.values()))
    @rule()
    def make_due(self) -> None:
        """Time passes: every waiting job's next run falls due (a first fire time in the future,
        a recurring job's next occurrence, a Retry-After)."""
        waiting = [m for m in self.models.values() if m.state in CLAIMABLE_STATES and not m.due]
        self.run(self._shift_into_past([m.id for m in waiting]))
        for m in waiting:
            m.due = True
            m.fire_passed = m.fire_passed or m.attempt == 0
            if m.attempt == 0:
                self.occurrence_at.pop(m.id, None)  # its grid moved with it

    def pause_or_resume(self, pick: int) -> None:
        """Pause a job (resume it, if paused): 409 naming the state when it is neither waiting
        nor paused. A paused retry resumes due now; a fresh occurrence keeps its fire time."""
        m = list(self.models.values())[pick % len(self.models)]
        action = "resume" if m.state == JobState.PAUSED or m.pause_requested else "pause"
        response = self.run(self.api("POST", f"/v1/jobs/{m.id}/{action}"))
        if action == "resume" and m.pause_requested:
            # The pause had not taken effect (its attempt is still open): withdrawn.
            assert response.status_code == 200, response.text
            m.pause_requested = False
            self.note("pause_withdrawn")
        elif action == "pause" and m.awaiting:
            # An open async attempt is never interrupted: the pause waits for its end.
            assert response.status_code == 200 and response.json()["pause_requested"], response.text
            m.pause_requested = True
            self.note("pause_requested")
        elif action == "resume":
            assert response.status_code == 200, response.text
            m.state = JobState.RETRYING if m.attempt else JobState.SCHEDULED
            m.due = bool(m.attempt) or m.fire_passed
            self.note("resumed")
        elif m.state in (JobState.SCHEDULED, JobState.RETRYING):
            assert response.status_code == 200, response.text
            m.state, m.due = JobState.PAUSED, False
            self.note("paused")
        else:
            assert response.status_code == 409 and response.json()["state"] == m.state.value, response.text

    def patch(self, pick: int, new_schedule: bool) -> None:
        """PATCH: a new schedule starts a fresh occurrence (attempts back to 0, a new fire time);
        another change leaves the occurrence as it is. Only while the job is waiting."""
        m = list(self.models.values())[pick % len(self.models)]
        change: dict[str, Any] = {"priority": 5}
        if new_schedule:
            change = {"every_s": EVERY_S} if m.recurring else {"delay_s": EVERY_S}
        response = self.run(self.api("PATCH", f"/v1/jobs/{m.id}", json=change))
        if m.state not in (JobState.SCHEDULED, JobState.RETRYING, JobState.PAUSED):
            assert response.status_code == 409 and response.json()["state"] == m.state.value, response.text
            return
        assert response.status_code == 200, response.text
        if not new_schedule:
            m.priority = 5
        if new_schedule:
            m.attempt, m.fire_passed, m.due = 0, False, False
            if m.state != JobState.PAUSED:
                m.state = JobState.SCHEDULED
            self.occurrence_at.pop(m.id, None)  # a new grid
            self.note("rescheduled")

    def trigger(self, pick: int) -> None:
        """POST /trigger: one extra occurrence now, as a one-off child job."""
        m = list(self.models.values())[pick % len(self.models)]
        response = self.run(self.api("POST", f"/v1/jobs/{m.id}/trigger"))
        if m.state in TERMINAL_STATES:
            assert response.status_code == 409, response.text
            return
        assert response.status_code == 201, response.text
        child = response.json()
        assert (child["parent_job_id"], child["schedule_kind"], child["max_attempts"]) == (
            str(m.id),
            "once",
            m.max_attempts,
        )
        # Delivered as its parent is: the job's own completion setting is copied.
        assert child["completion"] == ("async" if m.is_async else None), child
        child_id = uuid.UUID(child["id"])
        self.models[child_id] = JobModel(
            child_id, False, m.max_attempts, due=True, fire_passed=True, is_async=m.is_async
        )
        self.note("triggered")

    @precondition(lambda self: self.models)
    @rule(
        action=st.sampled_from(
            ["pause", "resume", "patch", "reschedule", "trigger", "cancel", "cancel_as_other", "put_named"]
        ),
        pick=picks,
    )
    def user_acts(self, action: str, pick: int) -> None:
        """One of the user's controls, through the API (cancel through the store, to try it
        as another tenant too)."""
        if action == "pause":
            self.pause_or_resume(pick)
        elif action == "resume":
            paused = [i for i, m in enumerate(self.models.values()) if m.state == JobState.PAUSED or m.pause_requested]
            if paused:
                self.pause_or_resume(paused[pick % len(paused)])
        elif action in ("patch", "reschedule"):
            self.patch(pick, new_schedule=action == "reschedule")
        elif action == "trigger":
            if len(self.models) < MAX_JOBS:
                self.trigger(pick)
        elif action == "put_named":
            self.put_named(NAMED_KEYS[pick % len(NAMED_KEYS)], new_payload=pick % 4 >= 2)
        else:
            self.cancel(pick, own_tenant=action == "cancel")

    def put_named(self, key: str, new_payload: bool) -> None:
        """PUT /v1/schedules/{key}: creates the key's job when it names none (a finished one
        frees it); a body that matches changes nothing, whatever the job is doing; a change
        applies as a PATCH does, so only while the job waits."""
        live = [m for m in self.models.values() if m.key == key and m.state not in TERMINAL_STATES]
        assert len(live) <= 1, f"two live jobs named {key}"
        m = live[0] if live else None
        if m is None and len(self.models) >= MAX_JOBS:
            return
        version = (m.version + 1 if new_payload else m.version) if m is not None else 0
        body = {
            "target_id": str(self.target_id),
            "payload": {"key": key, "v": version},
            "every_s": EVERY_S,
            "misfire_grace_s": 86_400,
            "max_attempts": 2,
            "backoff_base_s": 0.001,
            "backoff_max_s": 0.001,
        }
        response = self.run(self.api("PUT", f"/v1/schedules/{key}", json=body))
        if m is None:
            assert response.status_code == 201, response.text
            job_id = uuid.UUID(response.json()["id"])
            self.models[job_id] = JobModel(job_id, True, 2, key=key)
            self.note("put_created")
            return
        expected = sorted(({"payload"} if new_payload else set()) | ({"priority"} if m.priority else set()))
        if expected and m.state not in (JobState.SCHEDULED, JobState.RETRYING, JobState.PAUSED):
            assert response.status_code == 409 and response.json()["state"] == m.state.value, response.text
            return
        assert response.status_code == 200, response.text
        assert response.json()["id"] == str(m.id) and response.json()["changed"] == expected, response.text
        m.version, m.priority = version, 0
        self.note("put_changed" if expected else "put_unchanged")

    # -- rules: partitions -------------------------------------------------------------

    async def _stall(self, replica: str) -> None:
        """The replica stops renewing: its partition leases and its heartbeat run out, while its
        own view of what it holds still trusts them (as if its clock had stood still too)."""
        async with self.db.begin() as conn:
            past = func.now() - dt.timedelta(hours=1)
            await conn.execute(
                update(partition_leases).where(partition_leases.c.owner == replica).values(expires_at=past)
            )
            await conn.execute(update(replicas).where(replicas.c.id == replica).values(expires_at=past))

    # Only when there are claims to make or to deliver: that is where ownership matters.
    @precondition(lambda self: self.running() or self.due())
    @rule(event=st.sampled_from(["renew", "fail_over", "stalled_wakes"]))
    def partitions_move(self, event: str) -> None:
        """Ownership moves wholesale, so which jobs a replica may claim never depends on the
        partitions their random ids hash to.
        - renew: the owner's own round keeps what it holds;
        - fail_over: the owner stalls and the other replica's real round takes every partition
          over under higher epochs, while the stalled one's stale view remains;
        - stalled_wakes: the stalled replica runs a round, finds every partition lost
          (nothing to renew, nothing free to take) and trusts nothing any more; then it stalls
          again."""
        owner = self.owner
        other = next(r for r in REPLICAS if r != owner)
        if event == "renew":
            self.run(self.schedulers[owner].ownership.run_once())
            assert len(self.schedulers[owner].ownership.held()) == PARTITION_COUNT
            self.note("ownership_round")
        elif event == "fail_over":
            self.run(self._stall(owner))
            self.run(self.schedulers[other].ownership.run_once())
            assert len(self.schedulers[other].ownership.held()) == PARTITION_COUNT
            self.owner = other
            self.note("failed_over")
        elif self.schedulers[other].ownership.held():
            self.run(self.schedulers[other].ownership.run_once())
            assert self.schedulers[other].ownership.held() == {}
            self.run(self._stall(other))
            self.note("stale_round")

    @precondition(lambda self: self.due())
    @rule(replica=st.sampled_from(REPLICAS), limit=st.integers(1, 4))
    def claim(self, replica: str, limit: int) -> None:
        """A claim with the replica's own view of what it owns, stale or not: only jobs in
        partitions the database still says it owns under that epoch can be claimed."""
        scheduler = self.schedulers[replica]
        held = scheduler.ownership.held()

        async def claim_due() -> tuple[list[ClaimedJob], set[int]]:
            async with self.db.begin() as conn:
                owned = {
                    row.partition
                    for row in await conn.execute(
                        select(partition_leases.c.partition, partition_leases.c.epoch).where(
                            partition_leases.c.owner == replica, partition_leases.c.expires_at > func.now()
                        )
                    )
                    if held.get(row.partition) == row.epoch
                }
                return await job_claim_due(conn, TEST_KEY_RING, replica, limit, LEASE_S, held), owned

        claimed, owned = self.run(claim_due())
        claimed_mono = time.monotonic()
        partition_of = {row.id: row.partition for row in self.run(self.snapshot()).jobs}
        eligible = {m.id for m in self.due() if partition_of[m.id] in owned}
        ids = [job.id for job in claimed]
        assert len(ids) == len(set(ids)) == min(limit, len(eligible)), (ids, eligible)
        assert set(ids) <= eligible, "claimed a job that was not due, or from a partition it does not own"
        if any(partition_of[m.id] in held and partition_of[m.id] not in owned for m in self.due()):
            self.note("fenced_claim")
        for job in claimed:
            m = self.models[job.id]
            assert job.attempt == m.attempt + 1 <= m.max_attempts, (job.attempt, m)
            assert job.lease_owner == replica
            lease = Lease(job, replica, held[job.partition], claimed_mono)
            m.state, m.lease, m.lease_expired, m.due = JobState.RUNNING, lease, False, False
            m.attempt += 1
            m.claims += 1
            self.leases.append(lease)

    # -- rules: deliveries -------------------------------------------------------------

    async def deliver(self, lease: Lease, outcome: str) -> tuple[int, bool]:
        """The replica's own delivery path for the claim; returns (requests received, whether
        the replica still trusted the claim)."""
        scheduler = self.schedulers[lease.replica]
        trusted = scheduler.ownership.still_holds(lease.job.partition, lease.epoch)
        before = len(self.receiver.requests)
        self.receiver.script = [REPLIES[outcome]]
        await scheduler._deliver(lease.job, lease.epoch, lease.claimed_mono)
        self.receiver.script = []
        return len(self.receiver.requests) - before, trusted

    @precondition(lambda self: self.delivering())
    @rule(pick=picks, outcome=st.sampled_from(sorted(REPLIES)))
    def deliver_current(self, pick: int, outcome: str) -> None:
        """The lease holder delivers and records the attempt; if it lost the partition since
        the claim, it hands the claim back unsent instead. An async job's 202 leaves the
        attempt open; any other answer ends it as for a sync job."""
        running = self.delivering()
        self._deliver_current(running[pick % len(running)], outcome)

    def async_delivering(self) -> list[JobModel]:
        return [m for m in self.delivering() if m.is_async]

    @precondition(lambda self: self.async_delivering())
    @rule(pick=picks)
    def accept_async(self, pick: int) -> None:
        """An async job's receiver accepts the delivery (202), as most do: the attempt opens."""
        waiting = self.async_delivering()
        self._deliver_current(waiting[pick % len(waiting)], "accepted")

    def _deliver_current(self, m: JobModel, outcome: str) -> None:
        assert m.lease is not None
        lease = m.lease
        previous_fire = self.run(self.snapshot())
        fire = next(row.scheduled_for for row in previous_fire.jobs if row.id == m.id)
        posted, trusted = self.run(self.deliver(lease, outcome))
        if not trusted:
            assert posted == 0, "a POST for a claim its replica no longer trusted"
            m.state = JobState.RETRYING if m.attempt > 1 else JobState.SCHEDULED
            m.attempt -= 1
            m.lease, m.lease_expired, m.due = None, False, True
            self.occurrence_at.pop(m.id, None)  # due now, not at its fire time
            self.note("released_unsent")
            return
        assert posted == 1
        headers = self.receiver.requests[-1].headers
        assert ("cronhook-completion-url" in headers) == m.is_async, headers
        if m.is_async:
            path = urlsplit(headers["cronhook-completion-url"]).path
            if outcome == "accepted":
                # Open from now on: the 202 sets the attempt's own deadlines (a scheduler's
                # lapsed lease, not yet reaped, is replaced, as a recorded outcome ends it).
                m.token_path, m.lease_expired = path, False
                self.note("opened")
                return
            self.ended_tokens[path] = outcome == "success"
        expected = m.next_after("success" if outcome == "accepted" else outcome)
        m.attempt_ended(*expected)
        self.note("delivered")
        if m.recurring and expected[0] == JobState.SCHEDULED:
            self.occurrence_at[m.id] = fire  # the next occurrence is one interval later

    @precondition(lambda self: self.stale_leases())
    @rule(pick=picks, outcome=st.sampled_from(sorted(REPLIES)))
    def deliver_stale(self, pick: int, outcome: str) -> None:
        """A late delivery for a lease that was reaped, cancelled, released or already
        recorded: unsent if its replica no longer trusts it, else sent and fenced."""
        stale = self.stale_leases()
        lease = stale[pick % len(stale)]
        before = self.run(self.snapshot())
        posted, trusted = self.run(self.deliver(lease, outcome))
        after = self.run(self.snapshot())
        assert posted <= int(trusted)
        assert after.rows() == before.rows(), "a fenced completion changed the database"
        self.note("fenced")

    @precondition(lambda self: self.running())
    @rule(pick=picks, everyone=st.booleans())
    def expire_lease(self, pick: int, everyone: bool) -> None:
        """A scheduler stalls or dies: its lease (or every lease) runs out."""
        running = self.running()
        if everyone:
            self.run(expire_leases(self.db))
            chosen = running
        else:
            chosen = [running[pick % len(running)]]

            async def expire() -> None:
                async with self.db.begin() as conn:
                    await conn.execute(
                        update(jobs)
                        .where(jobs.c.id == chosen[0].id, jobs.c.state == JobState.RUNNING)
                        .values(lease_expires_at=func.now() - dt.timedelta(hours=1))
                    )

            self.run(expire())
        for m in chosen:
            m.lease_expired = True
            if m.awaiting and m.timeout is None:
                # An open attempt's lease is its heartbeat deadline (its deadline is still ahead).
                m.timeout = "heartbeat_timeout"

    @precondition(lambda self: self.running())
    @rule(batch_size=st.integers(1, 3))
    def reap(self, batch_size: int) -> None:
        expired = [m for m in self.running() if m.lease_expired]
        counts = self.run(
            Reaper(self.db, ReaperConfig(batch_size=batch_size), TEST_KEY_RING, rng=random.Random(0)).run_once()
        )
        states = {row.id: row.state for row in self.run(self.snapshot()).jobs}
        # Which expired leases a small batch takes is the reaper's choice; live ones stay.
        reaped = [m for m in expired if states[m.id] != JobState.RUNNING]
        assert len(reaped) == min(batch_size, len(expired)), "the reaper skipped an expired lease"
        predicted = {"rescued": 0, "dead_lettered": 0}
        newest_runs = self._newest_runs()
        for m in reaped:
            state, dead_lettered, due = m.next_after("lease_expired")
            predicted["dead_lettered" if dead_lettered else "rescued"] += 1
            self.note("reaped")
            run = newest_runs[m.id]
            if m.token_path is not None:
                # An open attempt fails as what ran out: its heartbeat deadline, or its deadline.
                assert (run.outcome, run.status_code, run.replica_id) == (m.timeout, 202, ASYNC_OWNER), run
                self.ended_tokens[m.token_path] = False
                self.note(f"async_{m.timeout}")
            else:
                assert run.outcome == "lease_expired", run
            m.attempt_ended(state, dead_lettered, due)
            if m.recurring and state == JobState.SCHEDULED:
                self.occurrence_at.pop(m.id, None)  # the reaper's next fire time is checked on the grid
        # Other upkeep the reaper may do is counted under other keys.
        assert {"rescued": counts.rescued, "dead_lettered": counts.dead_lettered} == predicted, (counts, predicted)

    def cancel(self, pick: int, own_tenant: bool) -> None:
        """The user cancels a job, in any state; another tenant's cancel changes nothing."""
        models = list(self.models.values())
        m = models[pick % len(models)]

        async def cancel_job() -> Any:
            async with self.db.begin() as conn:
                return await job_cancel(conn, self.tenant_id if own_tenant else self.other_tenant_id, m.id)

        row = self.run(cancel_job())
        assert (row is not None) == (own_tenant and m.state in CANCELLABLE_STATES), (own_tenant, m.state, row)
        if row is not None:
            self.note("cancelled")
            if m.token_path is not None:
                # An open attempt ends with a run of its own; its token is fenced from now on.
                m.runs += 1
                self.ended_tokens[m.token_path] = False
                self.note("cancelled_open")
            m.state, m.lease, m.lease_expired, m.due = JobState.CANCELLED, None, False, False
            m.token_path, m.progress, m.timeout, m.pause_requested = None, None, None, False

    # -- rules: asynchronous completion ------------------------------------------------

    def _newest_runs(self) -> dict[uuid.UUID, Row[Any]]:
        return {run.job_id: run for run in self.run(self.snapshot()).runs}  # ordered by id

    @precondition(lambda self: self.open_attempts())
    @rule(pick=picks, report=st.sampled_from(sorted(REPORTS)))
    def report(self, pick: int, report: str) -> None:
        """The receiver reports on its open attempt (no API key: the token is the capability);
        the job moves on as a delivery with that outcome would have moved it."""
        opened = self.open_attempts()
        m = opened[pick % len(opened)]
        assert m.token_path is not None
        body, outcome = REPORTS[report]
        fire = next(row.scheduled_for for row in self.run(self.snapshot()).jobs if row.id == m.id)
        attempt = m.attempt
        response = self.run(self.reporter.post(m.token_path, json=body))
        assert response.status_code == 204, response.text
        self.ended_tokens[m.token_path] = True
        expected = m.next_after(outcome)
        m.attempt_ended(*expected)
        if m.recurring and expected[0] == JobState.SCHEDULED:
            self.occurrence_at[m.id] = fire
        run = self._newest_runs()[m.id]
        assert (run.attempt, run.outcome, run.status_code) == (
            attempt,
            "success" if report == "succeeded" else "failed",
            202,
        ), run
        assert run.reported_at is not None and run.fenced_at is None, run
        assert run.result == body.get("result"), run
        self.note("reported")

    @precondition(lambda self: self.open_attempts())
    @rule(pick=picks, progress=st.integers(0, 100))
    def heartbeat(self, pick: int, progress: int) -> None:
        """The receiver says it is still at work: 204, its progress shown on the job."""
        opened = self.open_attempts()
        m = opened[pick % len(opened)]
        assert m.token_path is not None
        response = self.run(self.reporter.post(f"{m.token_path}/heartbeat", json={"progress": progress}))
        assert response.status_code == 204, response.text
        m.progress = progress
        if m.timeout == "heartbeat_timeout":
            # Before any reaper saw it lapse: the heartbeat deadline moves on (the deadline stays).
            m.timeout, m.lease_expired = None, False
        self.note("heartbeat")

    @precondition(lambda self: self.open_attempts())
    @rule(pick=picks, deadline=st.booleans())
    def time_runs_out(self, pick: int, deadline: bool) -> None:
        """An open attempt's receiver goes quiet: its heartbeat deadline passes (or its
        async_timeout_s deadline does), and the reaper's next pass fails it."""
        opened = self.open_attempts()
        m = opened[pick % len(opened)]

        async def lapse() -> None:
            past = func.now() - dt.timedelta(seconds=1)
            values: dict[str, Any] = {"lease_expires_at": func.least(jobs.c.lease_expires_at, past)}
            if deadline:
                values["async_deadline_at"] = past
            async with self.db.begin() as conn:
                await conn.execute(
                    update(jobs).where(jobs.c.id == m.id, jobs.c.lease_owner == ASYNC_OWNER).values(values)
                )

        self.run(lapse())
        m.lease_expired = True
        if deadline or m.timeout is None:
            m.timeout = "async_timeout" if deadline else "heartbeat_timeout"
        self.reap(batch_size=MAX_JOBS)

    @precondition(lambda self: self.ended_tokens)
    @rule(pick=picks, heartbeat=st.booleans(), report=st.sampled_from(sorted(REPORTS)))
    def report_late(self, pick: int, heartbeat: bool, report: str) -> None:
        """A report or heartbeat on a token whose attempt has ended: 409 when its receiver had
        finished it, else 410 and its run marked fenced; nothing else changes."""
        paths = list(self.ended_tokens)
        path = paths[pick % len(paths)]
        by_receiver = self.ended_tokens[path]
        token = read_token(TEST_KEY_RING.mac_keys, path.rsplit("/", 1)[1])
        assert token is not None
        before = self.run(self.snapshot())
        url = f"{path}/heartbeat" if heartbeat else path
        response = self.run(self.reporter.post(url, json={"progress": 1} if heartbeat else REPORTS[report][0]))
        assert response.status_code == (409 if by_receiver else 410), response.text
        assert response.headers["content-type"].startswith("application/problem+json")
        after = self.run(self.snapshot())
        assert (after.jobs, after.dead_letters) == (before.jobs, before.dead_letters), "a late report changed a job"

        def unfenced(rows: list[Row[Any]]) -> list[dict[str, Any]]:
            return [{k: v for k, v in row._mapping.items() if k != "fenced_at"} for row in rows]

        assert unfenced(after.runs) == unfenced(before.runs), "a late report changed a run"
        (run,) = [r for r in after.runs if (r.job_id, r.lease_token) == (token.job_id, token.lease_token)]
        assert (run.fenced_at is not None) == (not by_receiver), run
        self.note("late_report")

    @precondition(lambda self: any(m.dead_letters for m in self.models.values()))
    @rule(pick=picks)
    def replay_dead_letter(self, pick: int) -> None:
        """POST /v1/dead-letters/{id}/replay: a fresh one-off job, due now."""

        async def replay() -> tuple[uuid.UUID, dict[str, Any]]:
            async with self.db.connect() as conn:
                letters = list((await conn.execute(select(dead_letters))).all())
            order = list(self.models)
            # A deterministic order: the model's job order, then each job's occurrences in time.
            letters.sort(key=lambda letter: (order.index(letter.job_id), letter.scheduled_for))
            letter = letters[pick % len(letters)]
            response = await self.api("POST", f"/v1/dead-letters/{letter.id}/replay")
            assert response.status_code == 201, response.text
            body: dict[str, Any] = response.json()
            return letter.job_id, body

        original, job = self.run(replay())
        assert (job["state"], job["attempt"], job["schedule_kind"]) == (JobState.SCHEDULED, 0, "once"), job
        assert job["max_attempts"] == self.models[original].max_attempts
        is_async = self.models[original].is_async
        assert job["completion"] == ("async" if is_async else None), job
        job_id = uuid.UUID(job["id"])
        self.models[job_id] = JobModel(
            job_id, recurring=False, max_attempts=job["max_attempts"], due=True, is_async=is_async
        )
        self.models[job_id].fire_passed = True
        self.note("replayed")

    # -- invariants --------------------------------------------------------------------

    @invariant()
    def database_agrees_with_the_model(self) -> None:
        snap = self.run(self.snapshot())
        rows = {row.id: row for row in snap.jobs}
        assert len(rows) == len(snap.jobs) and set(rows) == set(self.models), "jobs appeared or vanished"
        letters_by_job: dict[uuid.UUID, list[Row[Any]]] = {job_id: [] for job_id in rows}
        for letter in snap.dead_letters:
            letters_by_job[letter.job_id].append(letter)
        runs_by_job = Counter(run.job_id for run in snap.runs)
        for job_id, row in rows.items():
            self._check_job(self.models[job_id], row, snap.now, letters_by_job[job_id], runs_by_job[job_id])
        self._check_dead_letters_and_runs(snap, rows)
        self._check_partitions(snap)
        live_keys = Counter(
            row.schedule_key for row in snap.jobs if row.schedule_key and JobState(row.state) not in TERMINAL_STATES
        )
        assert all(n == 1 for n in live_keys.values()), f"a key names several unfinished jobs: {live_keys}"
        for job_id, row in rows.items():
            assert row.schedule_key == self.models[job_id].key, (job_id, row.schedule_key)

    def _check_job(self, m: JobModel, row: Row[Any], now: dt.datetime, letters: list[Row[Any]], run_count: int) -> None:
        state = JobState(row.state)  # exactly one state, and a known one
        assert state == m.state, (m.id, state, m.state)
        assert 0 <= row.attempt <= row.max_attempts, row
        assert row.attempt == m.attempt, (row.attempt, m.attempt)
        leased = (row.lease_token, row.lease_owner, row.lease_expires_at)
        opened = (row.async_deadline_at, row.awaiting_since, row.completion_token_hash)
        if state == JobState.RUNNING:
            assert None not in leased, row
            assert m.lease is not None and row.lease_token == m.lease.job.lease_token
            if m.token_path is not None:
                # Open: held by no replica, its deadlines in the lease, its token's digest kept.
                assert row.lease_owner == ASYNC_OWNER and None not in opened, row
                assert row.lease_expires_at <= row.async_deadline_at, row
                token = m.token_path.rsplit("/", 1)[1]
                assert row.completion_token_hash == hashlib.sha256(token.encode()).hexdigest(), row
                assert row.progress == m.progress, (row.progress, m.progress)
                assert (row.pause_requested_at is not None) == m.pause_requested, row
            else:
                assert row.lease_owner == m.lease.replica
                assert opened == (None, None, None) and row.pause_requested_at is None, row
        else:
            assert leased == (None, None, None), row
            assert opened == (None, None, None) and row.progress is None, row
            if state != JobState.CANCELLED:
                assert row.pause_requested_at is None, row
        assert (row.run_at is not None) == (state in CLAIMABLE_STATES), row
        if state in CLAIMABLE_STATES:
            assert (row.run_at <= now) == m.due, (row.run_at, now, m.due)
        assert (row.finished_at is not None) == (state in TERMINAL_STATES), row

        if state in TERMINAL_STATES:
            assert self.terminal.setdefault(m.id, state) == state, "a terminal state changed"
        assert m.id not in self.terminal or state == self.terminal[m.id], "a job left its terminal state"

        assert len(letters) == m.dead_letters, (letters, m.dead_letters)
        if m.recurring:
            self._check_recurring(m, row, letters)
        else:
            assert (state == JobState.DEAD) == bool(letters), (state, letters)
            assert all(letter.occurrence_id == row.occurrence_id for letter in letters)

        # Every attempt that ended is recorded once; none is recorded that was not made.
        assert run_count == m.runs <= m.claims, (run_count, m.runs, m.claims)

    def _check_recurring(self, m: JobModel, row: Row[Any], letters: list[Row[Any]]) -> None:
        # A recurring job dead-letters the occurrence and goes on to the next one: every dead
        # letter is for an earlier occurrence than the current one. It never ends dead.
        assert row.state != JobState.DEAD, "a recurring job ended dead"
        for letter in letters:
            assert letter.occurrence_id != row.occurrence_id or m.ended, "a dead letter for the current occurrence"
            assert letter.scheduled_for <= row.scheduled_for, letter
        assert row.occurrences_run == m.occurrences, (row.occurrences_run, m.occurrences)
        # Fire times stay on the fixed-rate grid; after an occurrence the next is one interval on.
        assert (row.scheduled_for - row.schedule_anchor_at) % dt.timedelta(seconds=EVERY_S) == dt.timedelta(0), row
        if m.state == JobState.SCHEDULED and m.attempt == 0:
            # Due at its fire time (or at once, when a claim was handed back unsent).
            assert row.run_at >= row.scheduled_for, row
            if m.id in self.occurrence_at:
                assert row.scheduled_for == self.occurrence_at[m.id] + dt.timedelta(seconds=EVERY_S), row
                assert row.run_at == row.scheduled_for, row
        # max_runs ends it, succeeded, with its reason, once that many occurrences ended.
        if m.ended:
            # Nothing is due any more: no run_at, and it finished.
            assert (row.state, row.ended_reason, row.run_at) == (JobState.SUCCEEDED, "max_runs", None), row
            assert row.finished_at is not None, row
        else:
            assert row.ended_reason is None and (m.max_runs is None or m.occurrences < m.max_runs), row

    def _check_dead_letters_and_runs(self, snap: Snapshot, rows: dict[uuid.UUID, Row[Any]]) -> None:
        per_occurrence = Counter(letter.occurrence_id for letter in snap.dead_letters)
        assert max(per_occurrence.values(), default=0) <= 1, "two dead letters for one occurrence"

        attempts: dict[uuid.UUID, list[int]] = {}
        for run in snap.runs:
            attempts.setdefault(run.occurrence_id, []).append(run.attempt)
            assert 1 <= run.attempt <= rows[run.job_id].max_attempts, run
            assert (
                run.replica_id in (*REPLICAS, None)
                or run.outcome == "lease_expired"
                or (run.replica_id == ASYNC_OWNER and run.outcome in ASYNC_RUN_OUTCOMES)
            ), run
            # Only a receiver's report is recorded as one, and it is never fenced.
            assert run.reported_at is None or (run.outcome in ("success", "failed") and run.fenced_at is None), run
        for occurrence_id, numbers in attempts.items():
            assert len(numbers) == len(set(numbers)), ("an attempt recorded twice", occurrence_id, numbers)
        for letter in snap.dead_letters:
            # A dead letter counts the attempts its occurrence made, each of them recorded.
            assert 1 <= letter.attempts <= rows[letter.job_id].max_attempts, letter
            assert sorted(attempts.get(letter.occurrence_id, [])) == list(range(1, letter.attempts + 1)), letter
            if letter.replay_job_id is not None:
                assert letter.replay_job_id in rows, "a replay points at no job"

    def _check_partitions(self, snap: Snapshot) -> None:
        for row in snap.partitions:
            owner, epoch = self.partitions.get(row.partition, (None, 0))
            assert row.epoch >= epoch, f"partition {row.partition}: epoch fell {epoch} -> {row.epoch}"
            if row.owner is not None and row.owner != owner:
                assert row.epoch > epoch, f"partition {row.partition}: {owner} -> {row.owner} under one epoch"
            assert row.owner in (*REPLICAS, None), row
            self.partitions[row.partition] = (row.owner, row.epoch)


# Hundreds of steps through the API, the scheduler and PostgreSQL: slow on two busy cores.
@pytest.mark.timeout(480)
def test_job_lifecycle_keeps_its_invariants(db_url: str) -> None:
    stats: Counter[str] = Counter()
    run_state_machine_as_test(
        # Its docstring takes "a class or a function"; its annotation says only a class.
        lambda: LifecycleMachine(db_url, stats),  # type: ignore[arg-type]
        settings=settings(
            max_examples=30,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
            # The same examples every run, so the coverage check below cannot flake in CI.
            derandomize=True,
        ),
    )
    # Every rule with an effect ran somewhere (a coverage check, not a property).
    kinds = (
        "delivered",
        "fenced",
        "reaped",
        "cancelled",
        "replayed",
        "paused",
        "resumed",
        "rescheduled",
        "triggered",
        "ownership_round",
        "failed_over",
        "stale_round",
        "fenced_claim",
        "opened",
        "reported",
        "heartbeat",
        "late_report",
        "async_heartbeat_timeout",
        "async_async_timeout",
        "put_created",
    )
    # "cancelled_open" (a cancel that ends an open async attempt with a run) is checked where
    # the examples reach it, and deterministically in tests/e2e/test_async_completion.py.
    # "released_unsent" (a claim handed back unsent after its replica lost the partition) is
    # not required here: the examples reach it only by chance since the last trust check moved
    # into the connector; tests/e2e/test_faults.py checks it deterministically, on a new and on
    # a pooled connection.
    assert all(stats[kind] for kind in kinds), ([kind for kind in kinds if not stats[kind]], stats)
