"""The API fuzzed against its own OpenAPI document (issue 11 item 9): schemathesis drives a
real `cronhook up` as two tenants at once (each with a target and a recurring job whose ids
seed the path parameters, so get/patch/pause/cancel reach real rows), through the fuzzing
and stateful phases. Checks: no 5xx (`not_a_server_error`), every response matches its
documented schema, status and content type (`response_schema_conformance`,
`status_code_conformance`, `content_type_conformance`: the contract in app/api/contract.py
declares problem+json for every error, 429 included), and schema-invalid requests are
refused (`negative_data_rejection`). Off: `positive_data_acceptance` (see CHECKS) and the
`coverage` phase (it trips a SystemError inside schemathesis on Python 3.11).

CRONHOOK_FUZZ_SECONDS bounds each tenant's run (default 20; CI may raise it to a few minutes).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from pathlib import Path

import httpx
import pytest

from tests.e2e.test_processes import Processes, base_env, free_port, wait_until_ready

pytestmark = pytest.mark.e2e

SCHEMATHESIS = shutil.which("schemathesis") or str(Path(sys.executable).with_name("schemathesis"))
BOOTSTRAP_KEY = "chk_fuzz_bootstrap_key_for_tests"
ADMIN_KEY = "adm_fuzz_admin_key_for_tests_0001"
# positive_data_acceptance stays off: the contract cannot say everything the server checks
# (a cron expression's grammar, exactly one of run_at/delay_s/cron/every_s, an http(s) URL),
# so schema-valid requests get a correct 422 naming the field.
CHECKS = (
    "not_a_server_error,response_schema_conformance,status_code_conformance,content_type_conformance,"
    "negative_data_rejection"
)


async def _seed(http: httpx.AsyncClient, auth: dict[str, str]) -> dict[str, str]:
    target = (await http.post("/v1/targets", json={"name": "fuzz", "url": "http://127.0.0.1:9/h"}, headers=auth)).json()
    job = (
        await http.post("/v1/jobs", json={"target_id": target["id"], "payload": {}, "every_s": 3600}, headers=auth)
    ).json()
    return {"target_id": target["id"], "job_id": job["id"]}


async def _fuzz(base: str, key: str, ids: dict[str, str], workdir: Path, seconds: int) -> tuple[int, str]:
    config = workdir / f"schemathesis-{ids['job_id']}.toml"
    parameters = ", ".join(f'{name} = "{value}"' for name, value in ids.items())
    config.write_text(f'[[operations]]\ninclude-path-regex = ".*"\nparameters = {{ {parameters} }}\n')
    proc = await asyncio.create_subprocess_exec(
        SCHEMATHESIS,
        "--config-file",
        str(config),
        "run",
        f"{base}/openapi.json",
        "--header",
        f"Authorization: Bearer {key}",
        "--checks",
        CHECKS,
        "--phases",
        "examples,fuzzing,stateful",
        "--max-time",
        str(seconds),
        # One worker: with two (threads), hypothesis described lambdas with ast.parse in both at
        # once, and CPython 3.11's AST validator keeps its recursion depth in state the threads
        # share: "SystemError: AST constructor recursion depth mismatch" ended a CI run.
        "--workers",
        "1",
        "--exclude-tag",
        "admin",
        "--exclude-tag",
        "cluster",
        "--no-color",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "SCHEMATHESIS_HOOKS": ""},
        cwd=workdir,  # its cache folder (.schemathesis) goes there, not into the checkout
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=seconds + 240)
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace")


async def test_two_tenants_fuzzing_the_api_find_no_server_error_nor_schema_break(
    db_url: str, procs: Processes, tmp_path: Path
) -> None:
    seconds = int(os.environ.get("CRONHOOK_FUZZ_SECONDS", "20"))
    port = free_port()
    env = base_env(
        CRONHOOK_DATABASE_URL=db_url,
        CRONHOOK_BOOTSTRAP_API_KEY=BOOTSTRAP_KEY,
        CRONHOOK_ADMIN_API_KEY=ADMIN_KEY,
        # The fuzzer sends bad keys on purpose: throttling them would hide the rest.
        CRONHOOK_FAILED_AUTH_PER_MIN="1000000",
        CRONHOOK_LOG_LEVEL="WARNING",
    )
    procs.start("up", ["up", "--port", str(port)], env)
    base = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(base_url=base, timeout=10) as http:
        await wait_until_ready(http, timeout=30)
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        other_key = (await http.post("/v1/admin/tenants/fuzz-b/api-keys", headers=admin)).json()["key"]
        keys = [BOOTSTRAP_KEY, other_key]
        seeds = [await _seed(http, {"Authorization": f"Bearer {key}"}) for key in keys]

    results = await asyncio.gather(
        *(_fuzz(base, key, ids, tmp_path, seconds) for key, ids in zip(keys, seeds, strict=True))
    )
    for status, output in results:
        assert "test cases" in output.lower(), output[-3000:]
        assert status == 0, output[-6000:]
    assert "Traceback" not in procs.log("up"), procs.log("up")[-3000:]
