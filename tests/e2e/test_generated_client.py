"""A client generated from openapi/openapi.json (openapi-python-client) drives a live server:
every answer, errors included, parses into its declared model."""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.e2e.live_server import live_server
from tests.e2e.test_processes import Processes
from tests.receiver import Receiver

ROOT = Path(__file__).resolve().parents[2]
GENERATOR = Path(sys.executable).parent / "openapi-python-client"
# No post-generation hooks (they would run formatters from the network-less PATH): the
# generator itself reads only the local document, so this works offline.
CONFIG = "post_hooks: []\nproject_name_override: cronhook-client\npackage_name_override: cronhook_client\n"

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    if not GENERATOR.exists():
        pytest.fail("openapi-python-client is not installed: pip install -e '.[test]'")
    out = tmp_path_factory.mktemp("client")
    config = out / "config.yml"
    config.write_text(CONFIG)
    subprocess.run(
        [str(GENERATOR), "generate", "--path", str(ROOT / "openapi" / "openapi.json"), "--output-path",
         str(out / "gen"), "--config", str(config)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    sys.path.insert(0, str(out / "gen"))
    try:
        yield importlib.import_module("cronhook_client")
    finally:
        sys.path.remove(str(out / "gen"))
        for name in [m for m in sys.modules if m.split(".")[0] == "cronhook_client"]:
            del sys.modules[name]
        shutil.rmtree(out, ignore_errors=True)


def _mod(name: str) -> Any:
    return importlib.import_module(f"cronhook_client.{name}")


async def test_a_generated_client_drives_the_api_and_parses_every_answer(
    generated: ModuleType, receiver: Receiver, db_url: str, procs: Processes
) -> None:
    models = _mod("models")
    async with live_server(procs, db_url) as server:
        async with generated.AuthenticatedClient(base_url=server.url, token=server.key) as client:
            await _drive(generated, models, client, receiver.url(), server.url)


async def _drive(generated: ModuleType, models: Any, client: Any, receiver_url: str, server_url: str) -> None:
    """Create target, jobs (delayed, cron), get, list with pagination, PATCH, runs, cancel; then errors."""
    targets_api, jobs_api = "api.targets", "api.jobs"
    created = await _mod(f"{targets_api}.create_target").asyncio_detailed(
        client=client, body=models.TargetCreate(name="hooks", url=receiver_url)
    )
    assert created.status_code == 201 and isinstance(created.parsed, models.TargetWithSecret)
    target_id = created.parsed.id
    assert created.parsed.secret.startswith("whsec_")

    create_job = _mod(f"{jobs_api}.create_job")
    delayed = (
        await create_job.asyncio_detailed(
            client=client,
            body=models.JobCreate(
                target_id=target_id,
                delay_s=3600.0,
                name="delayed",
                priority=7,
                payload=models.Payload.from_dict({"order": 42}),
            ),
        )
    ).parsed
    assert isinstance(delayed, models.JobPublic) and delayed.state == models.JobState.SCHEDULED
    cron = (
        await create_job.asyncio_detailed(
            client=client, body=models.JobCreate(target_id=target_id, cron="0 3 * * *", timezone="Europe/Berlin")
        )
    ).parsed
    assert isinstance(cron, models.JobPublic) and cron.schedule_kind.value == "cron"

    got = (await _mod(f"{jobs_api}.get_job").asyncio_detailed(client=client, job_id=delayed.id)).parsed
    assert isinstance(got, models.JobPublic) and got.payload.to_dict() == {"order": 42}

    list_jobs = _mod(f"{jobs_api}.list_jobs")
    first = (await list_jobs.asyncio_detailed(client=client, limit=1)).parsed
    assert isinstance(first, models.PageJobPublic) and len(first.items) == 1 and first.next_cursor
    second = (await list_jobs.asyncio_detailed(client=client, limit=1, cursor=first.next_cursor)).parsed
    assert {first.items[0].id, second.items[0].id} == {delayed.id, cron.id}

    # PATCH with only the name: the priority stays what it was.
    patched = (
        await _mod(f"{jobs_api}.update_job").asyncio_detailed(
            client=client, job_id=delayed.id, body=models.JobUpdate(name="renamed")
        )
    ).parsed
    assert isinstance(patched, models.JobPublic)
    assert (patched.name, patched.priority) == ("renamed", 7)

    runs = (await _mod(f"{jobs_api}.list_job_runs").asyncio_detailed(client=client, job_id=delayed.id)).parsed
    assert isinstance(runs, models.PageRunPublic) and runs.items == []

    cancel = _mod(f"{jobs_api}.cancel_job")
    cancelled = (await cancel.asyncio_detailed(client=client, job_id=delayed.id)).parsed
    assert isinstance(cancelled, models.JobPublic) and cancelled.state == models.JobState.CANCELLED

    # Errors: each parses into the one Problem model.
    again = await cancel.asyncio_detailed(client=client, job_id=delayed.id)
    assert again.status_code == 409 and isinstance(again.parsed, models.Problem)
    assert again.parsed.status == 409 and "cancelled" in again.parsed.detail

    missing = await _mod(f"{jobs_api}.get_job").asyncio_detailed(client=client, job_id=uuid.uuid4())
    assert missing.status_code == 404 and isinstance(missing.parsed, models.Problem)

    invalid = await create_job.asyncio_detailed(
        client=client, body=models.JobCreate(target_id=target_id, cron="61 * * * *")
    )
    assert invalid.status_code == 422 and isinstance(invalid.parsed, models.Problem)
    assert [e.field for e in invalid.parsed.errors] == ["cron"]

    async with generated.Client(base_url=server_url) as anonymous:
        unauthorized = await _mod(f"{jobs_api}.list_jobs").asyncio_detailed(client=anonymous)
    assert unauthorized.status_code == 401 and isinstance(unauthorized.parsed, models.Problem)
