"""The compose deployment for real: docker-compose.yml and the Dockerfile built and started as
shipped (secrets from deploy/make-secrets.sh, the defaults of two scheduler containers of two
processes each), delivering signed webhooks to a receiver on the project's network, and losing
nothing when a scheduler container is killed, when the database restarts, and across `down` +
`up` (the key ring and the database volume kept: the cron job goes on, its target's signing
secret still opens).

Needs a Docker engine and the base images, which deploy/compose-e2e/prepare.sh provides; it
fails without them, it does not skip. Marked `compose`, outside `make test`:

    deploy/compose-e2e/prepare.sh && .venv/bin/python -m pytest -m compose tests/compose

PYTHON_IMAGE / POSTGRES_IMAGE choose the base images (default: prepare.sh's stand-ins),
E2E_COMPOSE the client ("docker compose"; default docker-compose v1 when installed). Each
phase's time is written as it ends: about 2 minutes on 2 CPUs, 30 s more for a cold build.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import httpx
import pytest
import yaml
from standardwebhooks.webhooks import Webhook

from tests.compose.deployment import COMPOSE_FILE, Deployment, Phases, Receiver, run, wait_until
from tests.unit.test_deployment import connection_budget

pytestmark = [pytest.mark.compose, pytest.mark.timeout(330)]

# Running containers per service at the compose file's defaults (SCHEDULER_REPLICAS=2).
EXPECTED = {"postgres": 1, "api": 1, "scheduler": 2, "reaper": 1}
HEALTHY_WITHIN_S = 120
# One-off jobs due over 4 s, while one of the two scheduler containers is killed.
BATCH = 200
BATCH_SPREAD_S = 4.0
TARGET_URL = "http://receiver:8000/hook"


class Api:
    """The deployment's API on 127.0.0.1, as the bootstrap key's tenant."""

    def __init__(self, http: httpx.Client) -> None:
        self.http = http

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = self.http.post(path, json=body)
        assert response.status_code == 201, response.text
        created: dict[str, Any] = response.json()
        return created

    def create_when_ready(self, path: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Retries one create (one Idempotency-Key) while the API cannot reach its database."""
        key = str(uuid.uuid4())

        def attempt() -> dict[str, Any] | None:
            try:
                response = self.http.post(path, json=body, headers={"Idempotency-Key": key})
            except httpx.HTTPError:
                return None
            if response.status_code >= 500:
                return None
            assert response.status_code == 201, response.text
            created: dict[str, Any] = response.json()
            return created

        created: dict[str, Any] = wait_until(attempt, timeout, f"POST {path} to succeed")
        return created

    def get(self, path: str) -> dict[str, Any]:
        response = self.http.get(path)
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body


class Deliveries:
    """What the receiver got, each delivery's signature verified with the target's secret."""

    def __init__(self, receiver: Receiver, secret: str) -> None:
        self.receiver = receiver
        self.webhook = Webhook(secret)

    def of(self, kind: str, after: float = 0.0) -> list[dict[str, Any]]:
        """Deliveries of jobs whose payload is {"e2e": kind, ...}, arrived after `after`."""
        found = []
        for delivery in self.receiver.received():
            # Raises on a bad signature: every delivery must open with the target's secret.
            payload = self.webhook.verify(delivery["body"], delivery["headers"])
            assert payload == json.loads(delivery["body"])
            if payload.get("e2e") == kind and delivery["at"] > after:
                found.append(delivery)
        return found

    def job_ids(self, kind: str) -> list[str]:
        return [delivery["headers"]["cronhook-job-id"] for delivery in self.of(kind)]


def test_the_deployment_delivers_signed_webhooks_and_loses_nothing(deployment: Deployment, phases: Phases) -> None:
    try:
        _start(deployment, phases)
        with phases("receiver on the project's network"):
            receiver = deployment.start_receiver()
        key = deployment.secret("bootstrap_api_key")
        with httpx.Client(base_url=deployment.api_url, headers={"Authorization": f"Bearer {key}"}, timeout=15) as http:
            _deliver_through_failures(deployment, phases, receiver, Api(http))
    except BaseException:
        phases.write(f"compose e2e: the services' last log lines:\n{deployment.logs(tail=40)}")
        raise


def _start(deployment: Deployment, phases: Phases) -> None:
    with phases("build"):
        deployment.compose("build", timeout=600)
    with phases("up refused without the secret files"):
        refusal = deployment.compose_fails("up", "--detach")
        assert "does not exist" in refusal, refusal
        assert not deployment.containers(running_only=True)
    with phases("secrets (deploy/make-secrets.sh)"):
        deployment.make_secrets()
    with phases("up --detach"):
        deployment.compose("up", "--detach", timeout=240)
    with phases("every service healthy (cronhook health --ready)"):
        deployment.wait_healthy(EXPECTED, HEALTHY_WITHIN_S)
    with phases("connections in use, against the budget"):
        budget = sum(connection_budget(yaml.safe_load(COMPOSE_FILE.read_text())).values())
        in_use = int(deployment.psql("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"))
        phases.write(f"compose e2e:   {in_use} connections in use, budget {budget}")
        assert in_use <= budget


def _deliver_through_failures(deployment: Deployment, phases: Phases, receiver: Receiver, api: Api) -> None:
    """Signed deliveries; then a killed scheduler container, a database restart, `down` + `up`."""
    with phases("one-off and cron (every second) delivered, signed"):
        target = api.create("/v1/targets", {"name": "e2e receiver", "url": TARGET_URL})
        deliveries = Deliveries(receiver, target["secret"])
        once = api.create("/v1/jobs", {"target_id": target["id"], "payload": {"e2e": "once"}, "delay_s": 1.0})
        cron = api.create("/v1/jobs", {"target_id": target["id"], "payload": {"e2e": "cron"}, "cron": "* * * * * *"})
        wait_until(lambda: deliveries.of("once") and len(deliveries.of("cron")) >= 3, 60, "first deliveries")
        assert deliveries.job_ids("once") == [once["id"]]
        assert set(deliveries.job_ids("cron")) == {cron["id"]}

    with phases(f"{BATCH} jobs delivered though a scheduler container is killed"):
        jobs = [
            {
                "target_id": target["id"],
                "payload": {"e2e": "batch", "n": n},
                "delay_s": 2.0 + n * BATCH_SPREAD_S / BATCH,
            }
            for n in range(BATCH)
        ]
        batch = api.create("/v1/jobs/batch", {"jobs": jobs})
        assert batch["created"] == BATCH
        expected = {item["id"] for item in batch["items"]}
        # While the batch is being delivered: SIGKILL, no clean stop, leases and partitions held.
        wait_until(lambda: deliveries.of("batch"), 30, "the batch's first delivery")
        victim = deployment.containers("scheduler", running_only=True)[0]
        run("docker", "kill", victim["Id"], timeout=30)
        wait_until(lambda: expected <= set(deliveries.job_ids("batch")), 120, f"all {BATCH} jobs delivered")
        received = deliveries.job_ids("batch")
        phases.write(f"compose e2e:   {len(received)} deliveries for {BATCH} jobs (at least once)")

    with phases("deliveries resume after a database restart"):
        (postgres,) = deployment.containers("postgres", running_only=True)
        run("docker", "restart", "--time", "30", postgres["Id"], timeout=90)
        restarted = time.time()
        wait_until(lambda: len(deliveries.of("cron", after=restarted)) >= 2, 90, "cron deliveries after the restart")
        after_restart = api.create_when_ready(
            "/v1/jobs", {"target_id": target["id"], "payload": {"e2e": "after-restart"}, "delay_s": 0.5}, 60
        )
        wait_until(lambda: deliveries.job_ids("after-restart") == [after_restart["id"]], 60, "the new job delivered")

    with phases("down (volumes kept)"):
        receiver.leave_network()
        deployment.compose("down", "--timeout", "45", timeout=180)
    with phases("up --detach again"):
        deployment.compose("up", "--detach", timeout=240)
        receiver.join_network()
    with phases("every service healthy again"):
        deployment.wait_healthy(EXPECTED, HEALTHY_WITHIN_S)
    with phases("jobs, key ring and signing secret kept"):
        up_again = time.time()
        # Signed with the secret the API returned before `down`: the new containers opened it
        # with the same key ring.
        wait_until(lambda: len(deliveries.of("cron", after=up_again)) >= 2, 60, "the cron job delivering again")
        # Alive, not quarantined (paused) as a key it cannot open left it before: an
        # every-second cron is "running" whenever a delivery is in flight, so both count.
        assert api.get(f"/v1/jobs/{cron['id']}")["state"] in {"scheduled", "running"}
        after_up = api.create("/v1/jobs", {"target_id": target["id"], "payload": {"e2e": "after-up"}, "delay_s": 0.5})
        wait_until(lambda: deliveries.job_ids("after-up") == [after_up["id"]], 60, "a new job delivered")
