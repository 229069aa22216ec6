"""Chains end to end (app/domain/chains.py): jobs that run after another job's occurrences
settle, with the API, the scheduler's passes and a real receiver on 127.0.0.1. Parents
answer on /parent, children on /child, grandchildren on /grandchild.
"""

from __future__ import annotations

import asyncio
import json
import signal
import uuid
from typing import Any
from urllib.parse import urlsplit

import httpx
from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.services.scheduler import Scheduler
from app.store.tables import jobs
from tests.conftest import make_job, make_target, new_tenant
from tests.e2e.test_delivery import drive, get_job
from tests.e2e.test_processes import Processes, short_lease_env
from tests.problems import assert_problem
from tests.receiver import Received, Receiver, Reply, wait_for


def at(receiver: Receiver, path: str) -> list[Received]:
    return [r for r in receiver.requests if r.path == path]


async def runs_of(client: httpx.AsyncClient, auth: dict[str, str], job_id: str) -> list[dict[str, Any]]:
    answer = await client.get(f"/v1/jobs/{job_id}/runs", headers=auth, params={"order": "asc"})
    assert answer.status_code == 200, answer.text
    items: list[dict[str, Any]] = answer.json()["items"]
    return items


async def chained(client: httpx.AsyncClient, auth: dict[str, str], target_id: str, **fields: Any) -> dict[str, Any]:
    answer = await client.post("/v1/jobs", headers=auth, json={"target_id": target_id, **fields})
    assert answer.status_code == 201, answer.text
    job: dict[str, Any] = answer.json()
    return job


async def carriers(engine: AsyncEngine, chained_id: str) -> int:
    """The occurrences a chained job was given (one-off jobs whose parent it is)."""
    async with engine.connect() as conn:
        count = await conn.scalar(select(func.count()).where(jobs.c.parent_job_id == uuid.UUID(chained_id)))
    return int(count or 0)


async def test_each_settled_parent_occurrence_fires_the_child_once_naming_its_cause(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler, engine: AsyncEngine
) -> None:
    parent_target = await make_target(client, auth, receiver.url("/parent"))
    child_target = await make_target(client, auth, receiver.url("/child"))
    parent = await make_job(client, auth, parent_target["id"], every_s=1)
    child = await chained(client, auth, child_target["id"], after={"job_id": parent["id"]}, payload={"step": 2})
    assert child["schedule_kind"] == "after" and child["state"] == "scheduled"
    assert child["after"] == {"job_id": parent["id"], "on": "success"} and child["next_run_at"] is None

    await drive(scheduler, lambda: len(at(receiver, "/child")) >= 3, timeout=60, message="three children")
    await client.post(f"/v1/jobs/{parent['id']}/cancel", headers=auth, params={"cascade": "true"})
    parents = {r.headers["webhook-id"] for r in at(receiver, "/parent")}
    causes = [r.headers["cronhook-cause-id"] for r in at(receiver, "/child")]
    # One child occurrence per parent occurrence, each naming its own.
    assert len(causes) == len(set(causes)) and set(causes) <= parents
    assert all(json.loads(r.body) == {"step": 2} for r in at(receiver, "/child"))
    assert all("cronhook-cause-id" not in r.headers for r in at(receiver, "/parent"))
    # The chained job's runs are its occurrences', each with its cause.
    runs = await runs_of(client, auth, child["id"])
    assert {run["cause_id"] for run in runs if run["outcome"] == "success"} == set(causes)
    assert await carriers(engine, child["id"]) == len(causes)


async def test_a_failure_chain_fires_after_the_parent_is_dead_lettered(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler
) -> None:
    receiver.by_path["/parent"] = Reply(status=500)
    parent_target = await make_target(client, auth, receiver.url("/parent"))
    child_target = await make_target(client, auth, receiver.url("/child"))
    parent = await make_job(client, auth, parent_target["id"], delay_s=0.2, max_attempts=2, backoff_base_s=0.05)
    on_failure = await chained(
        client, auth, child_target["id"], after={"job_id": parent["id"], "on": "failure"}, name="page"
    )
    on_success = await chained(client, auth, child_target["id"], after={"job_id": parent["id"]}, name="import")
    on_any = await chained(client, auth, child_target["id"], after={"job_id": parent["id"], "on": "any"})

    await drive(scheduler, lambda: len(at(receiver, "/child")) >= 2, timeout=60, message="the failure chain")
    for _ in range(5):
        await scheduler.run_once()
    assert (await get_job(client, auth, parent["id"]))["state"] == "dead"
    assert len(at(receiver, "/parent")) == 2  # both attempts, then the dead letter
    fired = {r.headers["cronhook-job-id"] for r in at(receiver, "/child")}
    by_parent = {(await get_job(client, auth, job_id))["parent_job_id"] for job_id in fired}
    assert by_parent == {on_failure["id"], on_any["id"]}
    assert len(at(receiver, "/child")) == 2
    assert (await runs_of(client, auth, on_success["id"])) == []
    # The cause is the dead-lettered occurrence.
    assert {r.headers["cronhook-cause-id"] for r in at(receiver, "/child")} == {
        at(receiver, "/parent")[0].headers["webhook-id"]
    }


async def test_a_child_added_while_its_parent_is_in_flight_fires_on_that_occurrence(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler
) -> None:
    release = asyncio.Event()
    receiver.by_path["/parent"] = Reply(hold=release)
    parent_target = await make_target(client, auth, receiver.url("/parent"), timeout_s=3)
    child_target = await make_target(client, auth, receiver.url("/child"))
    parent = await make_job(client, auth, parent_target["id"], delay_s=0.1)
    # A scheduler pass waits for its deliveries: this one runs while the test goes on.
    passes = asyncio.create_task(drive(scheduler, lambda: len(at(receiver, "/parent")) == 1, timeout=30))
    await wait_for(lambda: len(at(receiver, "/parent")) == 1, timeout=30, message="parent in flight")
    assert (await get_job(client, auth, parent["id"]))["state"] == "running"
    await chained(client, auth, child_target["id"], after={"job_id": parent["id"]})
    release.set()
    await passes
    await drive(scheduler, lambda: len(at(receiver, "/child")) == 1, timeout=30, message="the child")
    assert at(receiver, "/child")[0].headers["cronhook-cause-id"] == at(receiver, "/parent")[0].headers["webhook-id"]


async def test_a_chained_job_gets_the_parents_completion_result_as_its_payload(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler
) -> None:
    receiver.by_path["/parent"] = Reply(status=202, body=b"")
    parent_target = await make_target(client, auth, receiver.url("/parent"), completion="async")
    child_target = await make_target(client, auth, receiver.url("/child"))
    parent = await make_job(client, auth, parent_target["id"], delay_s=0.1)
    await chained(
        client, auth, child_target["id"], after={"job_id": parent["id"]}, payload_from="parent_result", payload={"x": 1}
    )
    await drive(scheduler, lambda: len(at(receiver, "/parent")) == 1, timeout=30, message="the 202")
    path = urlsplit(at(receiver, "/parent")[0].headers["cronhook-completion-url"]).path
    done = await client.post(path, json={"outcome": "succeeded", "result": {"exported": 41}})
    assert done.status_code == 204, done.text
    await drive(scheduler, lambda: len(at(receiver, "/child")) == 1, timeout=30, message="the child")
    assert json.loads(at(receiver, "/child")[0].body) == {"exported": 41}


async def test_chains_of_chains_fire_in_order(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler
) -> None:
    targets = {p: await make_target(client, auth, receiver.url(p)) for p in ("/parent", "/child", "/grandchild")}
    parent = await make_job(client, auth, targets["/parent"]["id"], delay_s=0.1)
    child = await chained(client, auth, targets["/child"]["id"], after={"job_id": parent["id"]})
    await chained(client, auth, targets["/grandchild"]["id"], after={"job_id": child["id"]})
    await drive(scheduler, lambda: len(at(receiver, "/grandchild")) == 1, timeout=30, message="the grandchild")
    (grand,) = at(receiver, "/grandchild")
    assert grand.headers["cronhook-cause-id"] == at(receiver, "/child")[0].headers["webhook-id"]
    assert [r.path for r in receiver.requests] == ["/parent", "/child", "/grandchild"]


async def test_settling_one_occurrence_twice_fires_its_children_once(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, scheduler: Scheduler, engine: AsyncEngine
) -> None:
    """A settle written twice for one occurrence (as a statement retried after its commit was
    lost would): the (chained job, cause) uniqueness keeps it to one child occurrence."""
    parent_target = await make_target(client, auth, receiver.url("/parent"))
    child_target = await make_target(client, auth, receiver.url("/child"))
    parent = await make_job(client, auth, parent_target["id"], delay_s=0.1)
    child = await chained(client, auth, child_target["id"], after={"job_id": parent["id"]})
    await drive(scheduler, lambda: len(at(receiver, "/child")) == 1, timeout=30, message="the child")
    # The parent's occurrence again, as it was before its outcome was written: due, same id.
    async with engine.begin() as conn:
        await conn.execute(
            update(jobs)
            .where(jobs.c.id == uuid.UUID(parent["id"]))
            .values(state="scheduled", run_at=func.now(), finished_at=None)
        )
    await drive(scheduler, lambda: len(at(receiver, "/parent")) == 2, timeout=30, message="delivered again")
    for _ in range(5):
        await scheduler.run_once()
    assert {r.headers["webhook-id"] for r in at(receiver, "/parent")} == {
        at(receiver, "/parent")[0].headers["webhook-id"]
    }
    assert len(at(receiver, "/child")) == 1
    assert await carriers(engine, child["id"]) == 1


async def test_bad_chains_are_422_naming_after_and_write_nothing(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver, engine: AsyncEngine
) -> None:
    target = await make_target(client, auth, receiver.url("/child"))
    root = await make_job(client, auth, target["id"], every_s=3600)

    async def refused(fields: dict[str, Any], *named: str) -> None:
        answer = await client.post("/v1/jobs", headers=auth, json={"target_id": target["id"], **fields})
        assert_problem(answer, 422, *named)

    await refused({"after": {"job_id": str(uuid.uuid4())}}, "after")
    other = await new_tenant(engine)
    other_target = await make_target(client, other, receiver.url("/other"))
    foreign = await make_job(client, other, other_target["id"], every_s=3600)
    await refused({"after": {"job_id": foreign["id"]}}, "after")
    await refused({"after": {"job_id": root["id"]}, "every_s": 60}, "every_s")
    await refused({"after": {"job_id": root["id"]}, "misfire_policy": "skip"}, "misfire_policy")
    await refused({"payload_from": "parent_result", "delay_s": 5}, "payload_from")
    await refused({"after": {"job_id": root["id"], "on": "sometimes"}}, "after.on")
    batch = await client.post(
        "/v1/jobs/batch", headers=auth, json={"jobs": [{"target_id": target["id"], "after": {"job_id": root["id"]}}]}
    )
    assert_problem(batch, 422, "jobs[0].after")
    finished = await make_job(client, auth, target["id"], delay_s=60)
    await client.post(f"/v1/jobs/{finished['id']}/cancel", headers=auth)
    await refused({"after": {"job_id": finished["id"]}}, "after")

    # Ten deep below the root is the limit.
    chain = [root]
    for _ in range(10):
        chain.append(await chained(client, auth, target["id"], after={"job_id": chain[-1]["id"]}))
    await refused({"after": {"job_id": chain[-1]["id"]}}, "after")
    # A cycle, by moving a job under its own descendant.
    moved = await client.patch(f"/v1/jobs/{chain[1]['id']}", headers=auth, json={"after": {"job_id": chain[3]["id"]}})
    assert_problem(moved, 422, "after")
    # Moving a chain so it would be too deep.
    side = await chained(client, auth, target["id"], after={"job_id": chain[8]["id"]})
    deep = await client.patch(f"/v1/jobs/{chain[5]['id']}", headers=auth, json={"after": {"job_id": side["id"]}})
    assert_problem(deep, 422, "after")
    # A chained job takes no schedule, and a scheduled job does not become chained.
    assert_problem(await client.patch(f"/v1/jobs/{chain[1]['id']}", headers=auth, json={"every_s": 5}), 422, "every_s")
    assert_problem(
        await client.patch(f"/v1/jobs/{root['id']}", headers=auth, json={"after": {"job_id": chain[1]["id"]}}),
        422,
        "after",
    )
    # Nothing of the refused requests was written.
    async with engine.connect() as conn:
        count = await conn.scalar(select(func.count()).where(jobs.c.schedule_kind == "after"))
    assert count == 11
    assert (await get_job(client, auth, chain[1]["id"]))["after"]["job_id"] == root["id"]


async def test_cancelling_a_parent_with_children_needs_cascade(
    client: httpx.AsyncClient, auth: dict[str, str], receiver: Receiver
) -> None:
    target = await make_target(client, auth, receiver.url("/child"))
    parent = await make_job(client, auth, target["id"], every_s=3600)
    child = await chained(client, auth, target["id"], after={"job_id": parent["id"]})
    grandchild = await chained(client, auth, target["id"], after={"job_id": child["id"]})
    refused = await client.post(f"/v1/jobs/{parent['id']}/cancel", headers=auth)
    body = assert_problem(refused, 409)
    assert body["children"] == 1
    assert (await get_job(client, auth, parent["id"]))["state"] == "scheduled"
    cascaded = await client.post(f"/v1/jobs/{parent['id']}/cancel", headers=auth, params={"cascade": "true"})
    assert cascaded.status_code == 200, cascaded.text
    for job in (parent, child, grandchild):
        assert (await get_job(client, auth, job["id"]))["state"] == "cancelled"
    # A paused chained job is armed again by resume, with no fire time of its own.
    other = await make_job(client, auth, target["id"], every_s=3600)
    lone = await chained(client, auth, target["id"], after={"job_id": other["id"]})
    assert (await client.post(f"/v1/jobs/{lone['id']}/pause", headers=auth)).json()["state"] == "paused"
    resumed = (await client.post(f"/v1/jobs/{lone['id']}/resume", headers=auth)).json()
    assert resumed["state"] == "scheduled" and resumed["next_run_at"] is None


async def test_a_scheduler_killed_between_the_parents_answer_and_its_outcome_fires_the_child_once(
    client: httpx.AsyncClient,
    auth: dict[str, str],
    receiver: Receiver,
    engine: AsyncEngine,
    db_url: str,
    procs: Processes,
) -> None:
    """`cronhook scheduler` processes: the one holding the parent's lease is stopped once the
    receiver has the delivery, the receiver answers 200, and the scheduler is SIGKILLed before
    it can record it. The reaper hands the occurrence on, another scheduler delivers it again
    (same webhook-id) and settles it: the child fires once, for that occurrence."""
    release = asyncio.Event()
    receiver.by_path["/parent"] = Reply(hold=release)
    parent_target = await make_target(client, auth, receiver.url("/parent"), timeout_s=3)
    child_target = await make_target(client, auth, receiver.url("/child"))
    parent = await make_job(client, auth, parent_target["id"], delay_s=0.2, backoff_base_s=0.05, backoff_max_s=0.1)
    child = await chained(client, auth, child_target["id"], after={"job_id": parent["id"]})
    env = short_lease_env(db_url)

    victim = procs.start("scheduler-a", ["scheduler"], {**env, "CRONHOOK_REPLICA_ID": "victim"})
    await wait_for(lambda: len(at(receiver, "/parent")) == 1, timeout=60, message="the parent in flight")
    victim.send_signal(signal.SIGSTOP)
    receiver.by_path["/parent"] = Reply()
    release.set()
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=5)
    procs.start("reaper", ["reaper"], env)
    procs.start("scheduler-b", ["scheduler"], {**env, "CRONHOOK_REPLICA_ID": "survivor"})

    async def all_settled() -> bool:
        async with engine.connect() as conn:
            unfinished = await conn.scalar(
                select(func.count()).where(
                    jobs.c.schedule_kind != "after", jobs.c.state.not_in(["succeeded", "dead", "cancelled"])
                )
            )
        return unfinished == 0 and len(at(receiver, "/child")) >= 1

    await wait_for(all_settled, timeout=90, interval=0.2, message="the parent redelivered and the child fired")
    delivered = at(receiver, "/parent")
    assert len(delivered) == 2 and delivered[0].headers["webhook-id"] == delivered[1].headers["webhook-id"]
    (fired,) = at(receiver, "/child")
    assert fired.headers["cronhook-cause-id"] == delivered[0].headers["webhook-id"]
    assert await carriers(engine, child["id"]) == 1
