"""The job lifecycle as a Hypothesis state machine, on a real PostgreSQL.

Rules drive jobs through the code the service runs: the store's claim and finish (as the
scheduler calls them), the reaper, cancel, and dead-letter replay through the HTTP API.
After every step the database is checked against a small model, and against invariants
that must hold whatever the interleaving: leases, attempts, terminal states, dead letters,
runs. The test gets its own database from the `db_url` fixture; each example empties it
and runs on its own event loop, since the rules are synchronous.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import random
import uuid
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test
from sqlalchemy import func, select, text, update
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.app import create_app
from app.db.engine import create_engine
from app.domain.job import AttemptOutcome, ClaimedJob, FinishedAttempt
from app.domain.lifecycle import after_attempt
from app.domain.schedule import IntervalSchedule
from app.domain.states import CANCELLABLE_STATES, CLAIMABLE_STATES, TERMINAL_STATES, JobState
from app.services.reaper import Reaper, ReaperConfig
from app.settings import Settings
from app.store.claims import job_claim_due
from app.store.jobs import db_now, job_cancel
from app.store.outcomes import job_finish_attempts
from app.store.tables import dead_letters, jobs, runs
from app.store.tenants import api_key_create, tenant_ensure
from tests.factories import expire_leases, make_jobs, make_tenant_and_target

T = TypeVar("T")

# Long enough never to expire by itself during an example: only `expire_lease` expires one.
LEASE_S = 300.0
# Recurring jobs fire hourly: a next occurrence is due only once `make_due` moves it.
EVERY_S = 3600
# Few jobs, many steps each: the interesting paths are deep (attempts, leases, replays).
MAX_JOBS = 6
OUTCOMES = {
    "success": AttemptOutcome("success", 200),
    "unavailable": AttemptOutcome("http_error", 503, "HTTP 503"),
    # Retry-After holds the retry back an hour: not due until `make_due`.
    "throttled": AttemptOutcome("http_error", 429, "HTTP 429", retry_after_s=3600.0),
    "rejected": AttemptOutcome("http_error", 404, "HTTP 404 (not retryable)", retryable=False),
}
# Indexes into the machine's lists, taken modulo their length (they shrink towards 0).
picks = st.integers(min_value=0, max_value=63)
Lease = tuple[uuid.UUID, uuid.UUID]


@dataclass
class JobModel:
    """What the test expects of one job; the database is checked against it after each step."""

    id: uuid.UUID
    recurring: bool
    max_attempts: int
    state: JobState = JobState.SCHEDULED
    due: bool = True  # waiting, with run_at in the past
    attempt: int = 0  # attempts made for the current occurrence
    lease: ClaimedJob | None = None  # the current lease, while running
    lease_expired: bool = False
    claims: int = 0  # attempts started, over all occurrences
    runs: int = 0  # attempts recorded, by their scheduler or by the reaper
    dead_letters: int = 0  # occurrences dead-lettered

    def next_after(self, outcome: str) -> tuple[JobState, bool, bool]:
        """(state, dead-lettered, due) once the current attempt ends with `outcome`;
        "lease_expired" when the reaper ends it."""
        failed = outcome != "success"
        if failed and outcome != "rejected" and self.attempt < self.max_attempts:
            return JobState.RETRYING, False, outcome != "throttled"  # the backoff is zero
        if self.recurring:
            return JobState.SCHEDULED, failed, False  # the next occurrence, an hour out
        return (JobState.DEAD if failed else JobState.SUCCEEDED), failed, False

    def attempt_ended(self, state: JobState, dead_lettered: bool, due: bool) -> None:
        self.state, self.due, self.lease, self.lease_expired = state, due, None, False
        self.runs += 1
        self.dead_letters += dead_lettered
        if state == JobState.SCHEDULED:
            self.attempt = 0


@dataclass(frozen=True)
class Snapshot:
    now: dt.datetime
    jobs: list[Row[Any]]
    runs: list[Row[Any]]
    dead_letters: list[Row[Any]]

    def rows(self) -> tuple[list[Row[Any]], ...]:
        return self.jobs, self.runs, self.dead_letters


class LifecycleMachine(RuleBasedStateMachine):
    def __init__(self, db_url: str, stats: Counter[str]) -> None:
        super().__init__()
        self.stats = stats
        self.loop = asyncio.new_event_loop()
        self.engine: AsyncEngine | None = None
        self.client: httpx.AsyncClient | None = None
        self.models: dict[uuid.UUID, JobModel] = {}  # in creation order
        self.leases: list[ClaimedJob] = []  # every lease handed out
        self.terminal: dict[uuid.UUID, JobState] = {}  # first terminal state seen in the database
        self.rng = random.Random(0)
        try:
            self.run(self._start(db_url))
        except BaseException:
            self.teardown()
            raise

    async def _start(self, db_url: str) -> None:
        self.engine = create_engine(db_url, pool_size=2)
        async with self.engine.begin() as conn:
            # The previous example's rows; everything a tenant owns goes with it.
            await conn.execute(text("TRUNCATE tenants CASCADE"))
        self.tenant_id, self.target_id = await make_tenant_and_target(self.engine, "http://127.0.0.1:9/unused")
        async with self.engine.begin() as conn:
            key = await api_key_create(conn, self.tenant_id)
            self.other_tenant_id = await tenant_ensure(conn, "someone-else")
        app = create_app(Settings(database_url=db_url, replica_id="stateful"), engine=self.engine)
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://cronhook.test",
            headers={"Authorization": f"Bearer {key}"},
        )

    def teardown(self) -> None:
        try:
            self.run(self._stop())
        finally:
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    async def _stop(self) -> None:
        try:
            if self.client is not None:
                await self.client.aclose()
            if self.engine is not None:
                # A connection left checked out is a leak in the code under test.
                assert self.engine.pool.checkedout() == 0, "a pooled connection was not returned"  # type: ignore[attr-defined]
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

    # -- the model ---------------------------------------------------------------------

    def due(self) -> list[JobModel]:
        return [m for m in self.models.values() if m.state in CLAIMABLE_STATES and m.due]

    def running(self) -> list[JobModel]:
        return [m for m in self.models.values() if m.state == JobState.RUNNING]

    def is_current(self, lease: ClaimedJob) -> bool:
        current = self.models[lease.id].lease
        return current is not None and current.lease_token == lease.lease_token

    def stale_leases(self) -> list[ClaimedJob]:
        """Leases that were reaped, cancelled or already recorded."""
        return [lease for lease in self.leases if not self.is_current(lease)]

    # -- the database ------------------------------------------------------------------

    async def snapshot(self) -> Snapshot:
        async with self.db.connect() as conn:
            return Snapshot(
                now=await db_now(conn),
                jobs=list((await conn.execute(select(jobs).order_by(jobs.c.id))).all()),
                runs=list((await conn.execute(select(runs).order_by(runs.c.id))).all()),
                dead_letters=list((await conn.execute(select(dead_letters).order_by(dead_letters.c.id))).all()),
            )

    async def finish(self, leases: list[ClaimedJob], outcome: str) -> tuple[set[Lease], dict[Lease, FinishedAttempt]]:
        """Records the attempts' outcome in one batch, as the scheduler's recorder does."""
        result = OUTCOMES[outcome]
        async with self.db.begin() as conn:
            now = await db_now(conn)
            items = [
                FinishedAttempt(
                    lease,
                    result,
                    after_attempt(
                        lease.attempt_context(),
                        result.succeeded,
                        now,
                        self.rng,
                        retryable=result.retryable,
                        retry_after_s=result.retry_after_s,
                    ),
                )
                for lease in leases
            ]
            applied = await job_finish_attempts(conn, items)
        return applied, {item.lease: item for item in items}

    # -- rules -------------------------------------------------------------------------

    @precondition(lambda self: len(self.models) < MAX_JOBS)
    @rule(recurring=st.booleans(), max_attempts=st.integers(1, 3), due=st.booleans())
    def create_job(self, recurring: bool, max_attempts: int, due: bool) -> None:
        (job_id,) = self.run(
            make_jobs(
                self.db,
                self.tenant_id,
                self.target_id,
                due_in_s=-1.0 if due else 3600.0,
                schedule=IntervalSchedule(EVERY_S) if recurring else None,
                max_attempts=max_attempts,
                backoff_base_s=0.0,  # a retry is due at once
            )
        )
        self.models[job_id] = JobModel(job_id, recurring, max_attempts, due=due)

    @precondition(lambda self: any(m.state in CLAIMABLE_STATES and not m.due for m in self.models.values()))
    @rule()
    def make_due(self) -> None:
        """Time passes: every waiting job's run_at moves into the past (a first fire time in
        the future, a recurring job's next occurrence, a Retry-After)."""

        async def move() -> None:
            async with self.db.begin() as conn:
                await conn.execute(
                    update(jobs)
                    .where(jobs.c.state.in_([s.value for s in CLAIMABLE_STATES]))
                    .values(run_at=func.now() - dt.timedelta(seconds=1))
                )

        self.run(move())
        for m in self.models.values():
            m.due = m.due or m.state in CLAIMABLE_STATES

    @precondition(lambda self: self.due())
    @rule(owner=st.sampled_from(["replica-a", "replica-b"]), limit=st.integers(1, 4))
    def claim(self, owner: str, limit: int) -> None:
        async def claim_due() -> list[ClaimedJob]:
            async with self.db.begin() as conn:
                return await job_claim_due(conn, owner, limit, LEASE_S)

        claimed = self.run(claim_due())
        due = {m.id for m in self.due()}
        ids = [job.id for job in claimed]
        assert len(ids) == len(set(ids)) == min(limit, len(due)), (ids, due)
        assert set(ids) <= due, "claimed a job that was not due"
        for job in claimed:
            m = self.models[job.id]
            assert job.attempt == m.attempt + 1 <= m.max_attempts, (job.attempt, m)
            assert job.lease_owner == owner
            m.state, m.lease, m.lease_expired, m.due = JobState.RUNNING, job, False, False
            m.attempt += 1
            m.claims += 1
            self.leases.append(job)

    @precondition(lambda self: self.running())
    @rule(pick=picks, outcome=st.sampled_from(sorted(OUTCOMES)), with_stale=st.booleans())
    def finish_current(self, pick: int, outcome: str, with_stale: bool) -> None:
        """The lease holder records its attempt; `with_stale` puts the same job's stale
        leases in the batch too (the recorder batches outcomes), where they must be fenced."""
        running = self.running()
        m = running[pick % len(running)]
        assert m.lease is not None
        lease = m.lease
        batch = [stale for stale in self.stale_leases() if stale.id == m.id] if with_stale else []
        applied, items = self.run(self.finish([*batch, lease], outcome))
        assert applied == {(lease.id, lease.lease_token)}, "the current lease was fenced, or a stale one applied"
        step = items[(lease.id, lease.lease_token)].step
        expected = m.next_after(outcome)
        assert (step.state, step.dead_letter) == expected[:2], (step, expected)
        self.note("finished")
        m.attempt_ended(*expected)

    @precondition(lambda self: self.stale_leases())
    @rule(pick=picks, outcome=st.sampled_from(sorted(OUTCOMES)))
    def finish_stale(self, pick: int, outcome: str) -> None:
        """A late outcome for a lease that was reaped, cancelled or already recorded."""
        stale = self.stale_leases()
        lease = stale[pick % len(stale)]
        before = self.run(self.snapshot())
        applied, _ = self.run(self.finish([lease], outcome))
        after = self.run(self.snapshot())
        assert applied == set(), "a stale lease recorded an outcome"
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

    @precondition(lambda self: self.running())
    @rule(batch_size=st.integers(1, 3))
    def reap(self, batch_size: int) -> None:
        expired = [m for m in self.running() if m.lease_expired]
        counts = self.run(Reaper(self.db, ReaperConfig(batch_size=batch_size), rng=random.Random(0)).run_once())
        states = {row.id: row.state for row in self.run(self.snapshot()).jobs}
        # Which expired leases a small batch takes is the reaper's choice; live ones stay.
        reaped = [m for m in expired if states[m.id] != JobState.RUNNING]
        assert len(reaped) == min(batch_size, len(expired)), "the reaper skipped an expired lease"
        predicted = {"rescued": 0, "dead_lettered": 0}
        for m in reaped:
            state, dead_lettered, due = m.next_after("lease_expired")
            predicted["dead_lettered" if dead_lettered else "rescued"] += 1
            self.note("reaped")
            m.attempt_ended(state, dead_lettered, due)
        # Other upkeep the reaper may do is counted under other keys.
        assert {key: counts[key] for key in predicted} == predicted, (counts, predicted)

    @precondition(lambda self: self.models)
    @rule(pick=picks, own_tenant=st.booleans())
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
            m.state, m.lease, m.lease_expired, m.due = JobState.CANCELLED, None, False, False

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
            assert self.client is not None
            response = await self.client.post(f"/v1/dead-letters/{letter.id}/replay")
            assert response.status_code == 201, response.text
            body: dict[str, Any] = response.json()
            return letter.job_id, body

        original, job = self.run(replay())
        assert (job["state"], job["attempt"], job["schedule_kind"]) == (JobState.SCHEDULED, 0, "once"), job
        assert job["max_attempts"] == self.models[original].max_attempts
        job_id = uuid.UUID(job["id"])
        self.models[job_id] = JobModel(job_id, recurring=False, max_attempts=job["max_attempts"])
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

    def _check_job(self, m: JobModel, row: Row[Any], now: dt.datetime, letters: list[Row[Any]], run_count: int) -> None:
        state = JobState(row.state)  # exactly one state, and a known one
        assert state == m.state, (m.id, state, m.state)
        assert 0 <= row.attempt <= row.max_attempts, row
        assert row.attempt == m.attempt, (row.attempt, m.attempt)
        leased = (row.lease_token, row.lease_owner, row.lease_expires_at)
        if state == JobState.RUNNING:
            assert None not in leased, row
            assert m.lease is not None and row.lease_token == m.lease.lease_token
        else:
            assert leased == (None, None, None), row
        assert (row.run_at is not None) == (state in CLAIMABLE_STATES), row
        if state in CLAIMABLE_STATES:
            assert (row.run_at <= now) == m.due, (row.run_at, now, m.due)
        assert (row.finished_at is not None) == (state in TERMINAL_STATES), row

        if state in TERMINAL_STATES:
            assert self.terminal.setdefault(m.id, state) == state, "a terminal state changed"
        assert m.id not in self.terminal or state == self.terminal[m.id], "a job left its terminal state"

        assert len(letters) == m.dead_letters, (letters, m.dead_letters)
        if m.recurring:
            # A recurring job dead-letters the occurrence and goes on to the next one: every
            # dead letter is for an earlier occurrence than the current one.
            assert state != JobState.DEAD
            for letter in letters:
                assert letter.occurrence_id != row.occurrence_id, "a dead letter for the current occurrence"
                assert letter.scheduled_for < row.scheduled_for, letter
        else:
            assert (state == JobState.DEAD) == bool(letters), (state, letters)
            assert all(letter.occurrence_id == row.occurrence_id for letter in letters)

        # Every attempt that ended is recorded once; none is recorded that was not made.
        assert run_count == m.runs <= m.claims, (run_count, m.runs, m.claims)

    def _check_dead_letters_and_runs(self, snap: Snapshot, rows: dict[uuid.UUID, Row[Any]]) -> None:
        per_occurrence = Counter(letter.occurrence_id for letter in snap.dead_letters)
        assert max(per_occurrence.values(), default=0) <= 1, "two dead letters for one occurrence"

        attempts: dict[uuid.UUID, list[int]] = {}
        for run in snap.runs:
            attempts.setdefault(run.occurrence_id, []).append(run.attempt)
            assert 1 <= run.attempt <= rows[run.job_id].max_attempts, run
        for occurrence_id, numbers in attempts.items():
            assert len(numbers) == len(set(numbers)), ("an attempt recorded twice", occurrence_id, numbers)
        for letter in snap.dead_letters:
            # A dead letter counts the attempts its occurrence made, each of them recorded.
            assert 1 <= letter.attempts <= rows[letter.job_id].max_attempts, letter
            assert sorted(attempts.get(letter.occurrence_id, [])) == list(range(1, letter.attempts + 1)), letter
            if letter.replay_job_id is not None:
                assert letter.replay_job_id in rows, "a replay points at no job"


def test_job_lifecycle_keeps_its_invariants(db_url: str) -> None:
    stats: Counter[str] = Counter()
    run_state_machine_as_test(
        lambda: LifecycleMachine(db_url, stats),
        settings=settings(
            max_examples=30,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
    # Every rule with an effect ran somewhere (a coverage check, not a property).
    kinds = ("finished", "fenced", "reaped", "cancelled", "replayed")
    assert all(stats[kind] for kind in kinds), stats
