"""Every statement in app/store that changes a job's state, checked against the transition
table (app/domain/states.py), so the table is the reference the store follows, not decoration.

STATE_CHANGES lists, per function holding a job UPDATE (or calling, directly or through other
helpers, a helper that holds it, in its own module or imported from another store module, as
the claim's statements are), the
states its WHERE clause accepts and the states it may leave the job in, using the same state
constants the store uses. The walk over app/store's source fails when an UPDATE of jobs
appears that the table does not cover.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import app.store
from app.domain.states import (
    CANCELLABLE_STATES,
    CHANGEABLE_STATES,
    CLAIMABLE_STATES,
    PAUSABLE_STATES,
    TERMINAL_STATES,
    TRANSITIONS,
    JobState,
)

S = JobState
RUNNING = (S.RUNNING,)  # the lease guard of every write on behalf of a claim
LIVE = tuple(state for state in S if state not in TERMINAL_STATES)

# (module, function): (states expected, states it may leave the job in). A state that is
# also expected means "left as it was", which is not a transition.
STATE_CHANGES: dict[tuple[str, str], tuple[tuple[JobState, ...], tuple[JobState, ...]]] = {
    ("jobs", "job_cancel"): (CANCELLABLE_STATES, (S.CANCELLED,)),
    ("jobs", "job_pause"): (PAUSABLE_STATES, (S.PAUSED,)),
    ("jobs", "job_resume"): ((S.PAUSED,), (S.SCHEDULED, S.RETRYING)),
    # PATCH: a new schedule or new bounds make a waiting job scheduled (a paused one stays paused).
    ("jobs", "job_update"): (CHANGEABLE_STATES, (S.SCHEDULED,)),
    # The claim's statements are built in claim_statements.py and run by claims.py.
    ("claims", "job_claim_batch"): (CLAIMABLE_STATES, (S.RUNNING,)),
    # Leases a limited target's candidates once it has their delivery slots.
    ("claims", "_lease_limited"): (CLAIMABLE_STATES, (S.RUNNING,)),
    ("lease_writes", "job_quarantine"): (RUNNING, (S.PAUSED,)),
    ("lease_writes", "job_release_claim"): (RUNNING, (S.SCHEDULED, S.RETRYING)),
    # What a claim whose answer was lost leased (no POST was made): handed back the same way.
    ("lease_writes", "job_release_unanswered_claim"): (RUNNING, (S.SCHEDULED, S.RETRYING)),
    # The parent moves on; its child is inserted running (it carries the claim on).
    ("lease_writes", "job_hand_off_occurrence"): (RUNNING, (S.SCHEDULED, S.SUCCEEDED)),
    ("lease_writes", "job_settle_due_plan"): (RUNNING, (S.RUNNING, S.SCHEDULED, S.SUCCEEDED)),
    # Async completion: a 202 leaves the attempt open (running, held by no replica), and a
    # heartbeat pushes its deadline; neither changes the state (reports finish through
    # job_finish_attempts).
    ("completions", "job_open_async_attempts"): (RUNNING, (S.RUNNING,)),
    ("completions", "job_heartbeat"): (RUNNING, (S.RUNNING,)),
    # A pause asked for while an attempt is open is noted (or withdrawn by a resume), and
    # applied to the jobs whose attempt just ended and that now wait.
    ("completions", "job_request_pause"): (RUNNING, (S.RUNNING,)),
    ("completions", "job_withdraw_pause"): (RUNNING, (S.RUNNING,)),
    ("completions", "job_apply_requested_pauses"): (PAUSABLE_STATES, (S.PAUSED,)),
    # A named schedule's new job gets its key; its state stays.
    ("schedule_keys", "job_set_key"): ((S.SCHEDULED, S.PAUSED), ()),
    # A set's new and adopted schedules get their keys and set; their state stays.
    ("schedule_keys", "job_name_many"): (LIVE, ()),
    # A parent whose settling must fire chained children is marked; its state stays.
    ("chains", "job_mark_fires_children"): (LIVE, ()),
    # Pause and hold: a held occurrence stays waiting (run_at HELD); a release makes it due
    # again, and clears the held_run_at of jobs that moved on meanwhile (never running ones).
    ("pauses", "_hold_statement"): (CLAIMABLE_STATES, ()),
    ("pauses", "_hold_due_statement"): (CLAIMABLE_STATES, ()),
    ("pauses", "_release_statement"): (tuple(s for s in S if s is not S.RUNNING), ()),
    # The health watch records a job's verdict (health_alert) on unfinished jobs; state stays.
    ("health", "edge_statement"): (LIVE, ()),
    # Every state app/domain/lifecycle.py's after_attempt can choose.
    ("outcomes", "job_finish_attempts"): (RUNNING, (S.SUCCEEDED, S.SCHEDULED, S.RETRYING, S.DEAD)),
    # The same statement, run with an empty batch (it matches no job) before any claim.
    ("outcomes", "job_finish_warm_up"): (RUNNING, (S.SUCCEEDED, S.SCHEDULED, S.RETRYING, S.DEAD)),
}


@pytest.mark.parametrize(("where", "change"), STATE_CHANGES.items(), ids=[f"{m}.{f}" for m, f in STATE_CHANGES])
def test_every_state_change_in_the_store_is_an_allowed_transition(
    where: tuple[str, str], change: tuple[tuple[JobState, ...], tuple[JobState, ...]]
) -> None:
    expected, results = change
    for before in expected:
        for after in results:
            if after != before:
                assert after in TRANSITIONS[before], f"{where}: {before} -> {after} is not in TRANSITIONS"


def _store_imports(tree: ast.Module) -> dict[str, tuple[str, str]]:
    """The names a store module imports from other store modules: name -> (module, function)."""
    imported = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("app.store."):
            for alias in node.names:
                imported[alias.asname or alias.name] = (node.module.removeprefix("app.store."), alias.name)
    return imported


def _job_updates() -> tuple[set[tuple[str, str]], dict[tuple[str, str], set[tuple[str, str]]]]:
    """The store's functions that hold an UPDATE of jobs, and who calls each function (a
    call of an imported function counts where that function is defined)."""
    updating: set[tuple[str, str]] = set()
    callers: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for path in sorted(Path(app.store.__file__).parent.glob("*.py")):
        module = path.stem
        tree = ast.parse(path.read_text())
        imported = _store_imports(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
                func = call.func
                is_update = (isinstance(func, ast.Name) and func.id == "update") or (
                    isinstance(func, ast.Attribute) and func.attr == "update"
                )
                if is_update and any(isinstance(arg, ast.Name) and arg.id == "jobs" for arg in call.args):
                    updating.add((module, node.name))
                if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "jobs":
                    if func.attr == "update":
                        updating.add((module, node.name))
                if isinstance(func, ast.Name):
                    callee = imported.get(func.id, (module, func.id))
                    callers.setdefault(callee, set()).add((module, node.name))
    return updating, callers


def _entry_points(
    function: tuple[str, str], callers: dict[tuple[str, str], set[tuple[str, str]]]
) -> set[tuple[str, str]]:
    """The functions that change job state through `function`: the nearest functions in the
    table on each chain of callers up from it (a helper's helper counts as the helper)."""
    found: set[tuple[str, str]] = set()
    seen = {function}
    frontier = [function]
    while frontier:
        current = frontier.pop()
        if current in STATE_CHANGES:
            found.add(current)
            continue
        users = callers.get(current, set())
        assert users, (
            f"{current} updates jobs (itself or through {function}) and neither it nor a caller is in STATE_CHANGES"
        )
        for user in users - seen:
            seen.add(user)
            frontier.append(user)
    return found


def test_the_table_covers_every_update_of_jobs_in_the_store() -> None:
    updating, callers = _job_updates()
    assert updating, "the walk found no UPDATE of jobs: it no longer reads the store"
    reached = set()
    for function in updating:
        reached |= _entry_points(function, callers)
    assert set(STATE_CHANGES) <= reached, f"{sorted(set(STATE_CHANGES) - reached)} are in the table but change no job"
