"""The published contract types cleanly in generated clients (openapi-typescript,
openapi-python-client): request fields the server fills in stay optional, every member a problem
can carry is declared, every error status has its own title, and every reference resolves."""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.openapi.utils import get_openapi

from app.api.app import create_app
from app.api.contract import request_models
from app.api.errors import TITLES
from app.api.schemas.dead_letters import DeadLetterBulkReplay
from app.api.schemas.jobs import JobCreate
from app.api.schemas.targets import TargetRotate
from app.settings import Settings

API_DIR = Path(__file__).resolve().parents[2] / "app" / "api"


@pytest.fixture(scope="module")
def contract() -> dict[str, Any]:
    doc: dict[str, Any] = create_app(Settings()).openapi()
    return doc


def _nodes(node: Any, where: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema object under `node`, with its path."""
    if isinstance(node, dict):
        yield where, node
        for key, value in node.items():
            yield from _nodes(value, f"{where}/{key}")
    elif isinstance(node, list):
        for index, item in enumerate(node):
            yield from _nodes(item, f"{where}/{index}")


def test_request_models_are_those_of_the_request_bodies(contract: dict[str, Any]) -> None:
    models = request_models(contract)
    assert {"JobCreate", "JobBatchCreate", "JobUpdate", "DeadLetterBulkReplay", "TargetRotate"} <= models
    # Reached through JobCreate only: referenced schemas count too.
    assert {"MisfirePolicy", "Payload"} <= models
    assert not {"JobPublic", "Problem", "RunPublic"} & models


def test_no_request_schema_has_a_default(contract: dict[str, Any]) -> None:
    schemas = contract["components"]["schemas"]
    defaults = [
        f"{name}{where}"
        for name in request_models(contract)
        for where, node in _nodes(schemas[name])
        if "default" in node and not where.endswith("/properties")
    ]
    # openapi-typescript makes a field with a default required: a client would have to send it.
    assert defaults == []


def test_each_default_the_server_fills_in_is_in_the_description(contract: dict[str, Any]) -> None:
    app = create_app(Settings())
    raw = get_openapi(title="raw", version="0", routes=app.routes, openapi_version="3.1.0")
    raw_schemas = raw["components"]["schemas"]
    published = contract["components"]["schemas"]
    said: dict[str, Any] = {}
    for name in request_models(contract) - {"JobUpdate", "TargetUpdate", "DeadLetterReplay"}:
        for field, prop in raw_schemas.get(name, {}).get("properties", {}).items():
            if prop.get("default") is not None:
                description = published[name]["properties"][field]["description"]
                assert description.endswith(f"Default: {json.dumps(prop['default'])}."), (name, field)
                said[f"{name}.{field}"] = prop["default"]
    assert said == {
        "JobCreate.priority": 0,
        "SetItem.priority": 0,
        "DeadLetterBulkReplay.include_replayed": False,
        "DeadLetterBulkReplay.limit": 100,
        "DeadLetterBulkReplay.rate_per_s": 10.0,
        "TargetRotate.grace_s": 86400,
        "ResumeOptions.on_resume": "deliver_all",
    }


def test_the_server_still_fills_in_what_the_contract_leaves_out() -> None:
    job = JobCreate.model_validate({"target_id": "3f8e2a4c-0d1b-4a7e-9b2c-5d6e7f8a9b0c", "delay_s": 60})
    assert job.priority == 0
    replay = DeadLetterBulkReplay.model_validate({})
    assert (replay.include_replayed, replay.limit, replay.rate_per_s) == (False, 100, 10.0)
    assert TargetRotate.model_validate({}).grace_s == 86400


def _extension_members() -> dict[str, str]:
    """The members the app adds to a problem (`extra={...}` given to Problem or
    problem_response), each with where it is added."""
    found: dict[str, str] = {}
    for path in sorted(API_DIR.rglob("*.py")):
        if path.name == "errors.py":
            continue  # where `extra` is passed on, not made
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            callee = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            if callee not in ("Problem", "problem_response"):
                continue
            for keyword in node.keywords:
                if keyword.arg != "extra":
                    continue
                where = f"{path.relative_to(API_DIR.parent.parent)}:{node.lineno}"
                # A literal, so that this test sees each name.
                assert isinstance(keyword.value, ast.Dict), f"{where}: extra= is not a dict literal"
                for key in keyword.value.keys:
                    assert isinstance(key, ast.Constant) and isinstance(key.value, str), where
                    found[key.value] = where
    return found


def test_every_problem_member_the_app_adds_is_declared(contract: dict[str, Any]) -> None:
    members = _extension_members()
    assert {"job_id", "state", "outcome", "limit", "max_active_jobs", "max_targets", "active_jobs"} <= set(members)
    declared = contract["components"]["schemas"]["Problem"]["properties"]
    undeclared = {name: where for name, where in members.items() if name not in declared}
    assert undeclared == {}
    for name in members:
        assert declared[name].get("description"), name
        assert name not in contract["components"]["schemas"]["Problem"]["required"], name


def test_every_error_status_has_its_own_title(contract: dict[str, Any]) -> None:
    declared = {
        int(status)
        for item in contract["paths"].values()
        for operation in item.values()
        for status in operation["responses"]
        if status[0] in "45"
    }
    assert {400, 401, 403, 404, 409, 410, 413, 422, 429, 503} <= declared
    # Also the framework's own (an unknown method, a body that is not JSON) and the catch-all's.
    answered = declared | {405, 415, 500}
    assert answered - set(TITLES) == set()
    assert TITLES[403] == "Forbidden" and TITLES[429] == "Too Many Requests" and TITLES[410] == "Gone"


def test_every_reference_resolves(contract: dict[str, Any]) -> None:
    schemas = contract["components"]["schemas"]
    dangling = [
        f"{where}: {node['$ref']}"
        for where, node in _nodes(contract)
        if isinstance(node.get("$ref"), str) and node["$ref"].removeprefix("#/components/schemas/") not in schemas
    ]
    assert dangling == []
