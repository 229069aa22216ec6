"""The jobs a bench creates before they fall due (creation is not what it measures): set-based
rows, n at a time (`jobs_insert_series`: one INSERT ... SELECT generate_series(...)), or
bodies for POST /v1/jobs/batch (`create_jobs_batch`) where the service serves it. Single
creates through the API run at a fraction of the rate of the drains they would feed.

Benches import this through harness.py.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from processes import Service
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

# Rows shaped as job_create writes them, n at a time. The partition is the last byte of the
# random v4 id (uniform over 0..255) rather than app.domain.partition's hash of it: the claim
# only reads the stored column, and PostgreSQL has no blake2b. Finished rows are succeeded
# one-offs with one attempt, for the scale bench's history.
_INSERT_SERIES = text(
    """
    WITH p AS (SELECT CAST(:state AS job_state) AS state, CAST(:finished AS boolean) AS finished,
                      CAST(:first_due AS float8) AS first_due, CAST(:step_s AS float8) AS step_s)
    INSERT INTO jobs (id, partition, tenant_id, target_id, payload, priority, state, schedule_kind,
                      timezone, schedule_anchor_at, scheduled_for, occurrence_id, run_at, attempt,
                      occurrences_run, finished_at, max_attempts, backoff_base_s, backoff_max_s)
    SELECT g.id, get_byte(uuid_send(g.id), 15), t.tenant_id, t.id, jsonb_build_object('seq', g.i), 0,
           p.state, 'once', 'UTC', g.due, g.due, gen_random_uuid(),
           CASE WHEN p.finished THEN NULL ELSE g.due END,
           CASE WHEN p.finished THEN 1 ELSE 0 END, CASE WHEN p.finished THEN 1 ELSE 0 END,
           CASE WHEN p.finished THEN g.due + interval '1 second' END, CAST(:max_attempts AS integer), 2.0, 600.0
    FROM p, targets t,
         LATERAL (SELECT i, gen_random_uuid() AS id, to_timestamp(p.first_due + p.step_s * i) AS due
                  FROM generate_series(CAST(:first AS integer), CAST(:last AS integer)) AS i) g
    WHERE t.id = CAST(:target_id AS uuid)
    """
)

_RUNS_OF_FINISHED = text(
    """
    INSERT INTO runs (job_id, tenant_id, occurrence_id, scheduled_for, attempt, replica_id, started_at,
                      finished_at, status_code, duration_ms, outcome)
    SELECT id, tenant_id, occurrence_id, scheduled_for, 1, 'bench', scheduled_for, finished_at, 200, 5, 'success'
    FROM jobs WHERE state = 'succeeded'
    """
)


async def jobs_insert_series(
    conn: AsyncConnection,
    target_id: uuid.UUID,
    n: int,
    first_due: float,
    step_s: float,
    state: str = "scheduled",
    max_attempts: int = 5,
    chunk: int = 250_000,
) -> None:
    """n one-off jobs of the target's tenant, due at first_due + i * step_s (epoch seconds),
    in statements of `chunk` rows (one transaction: the caller's). The service's default
    retry policy, unless `max_attempts` says otherwise."""
    finished = state != "scheduled"
    for first in range(0, n, chunk):
        params = {"state": state, "finished": finished, "first_due": first_due, "step_s": step_s}
        params.update(first=first, last=min(n, first + chunk) - 1, target_id=target_id, max_attempts=max_attempts)
        await conn.execute(_INSERT_SERIES, params)


async def runs_insert_for_finished(conn: AsyncConnection) -> None:
    """One successful run per succeeded job."""
    await conn.execute(_RUNS_OF_FINISHED)


def rfc3339(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch)) + f".{int(epoch % 1 * 1e6):06d}Z"


BATCH_PATH = "/v1/jobs/batch"
BATCH_MAX = 1000


def batch_body(target_id: uuid.UUID, start: int, count: int, first_due: float, step_s: float) -> dict[str, Any]:
    """The body of one POST /v1/jobs/batch: {"jobs": [job create bodies]}."""
    return {
        "jobs": [
            {"target_id": str(target_id), "payload": {"seq": i}, "run_at": rfc3339(first_due + i * step_s)}
            for i in range(start, start + count)
        ]
    }


def create_jobs_batch(service: Service, target_id: uuid.UUID, n: int, first_due: float, step_s: float) -> bool:
    """Creates n jobs through POST /v1/jobs/batch, 1,000 per request; False (nothing created)
    when the endpoint does not exist (404/405 on the first request)."""
    for start in range(0, n, BATCH_MAX):
        count = min(BATCH_MAX, n - start)
        status, body = service.api("POST", BATCH_PATH, batch_body(target_id, start, count, first_due, step_s))
        if start == 0 and status in (404, 405):
            return False
        if status not in (200, 201):
            raise RuntimeError(f"POST {BATCH_PATH} answered {status}: {str(body)[:300]}")
    return True
