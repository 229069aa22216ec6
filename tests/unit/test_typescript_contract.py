"""The published contract type-checks a real TypeScript client: this module owns that check.
Types are generated from the committed openapi/openapi.json with openapi-typescript, and
tests/typescript/client.ts (openapi-fetch) is compiled against them by `tsc --strict`; the
README's TypeScript snippet is part of that client. The committed document is the one used:
tests/integration/test_schema_and_docs.py holds it equal to the app's, and
tests/unit/test_contract_types.py holds the rules on the document that make the check pass.

The Node tools are pinned in tests/typescript/package-lock.json and installed by `make ts-deps`
(`make test` does not need npm): without them the test skips, except in CI (CI=true), where
.ci/run installs them and a skip would hide a broken contract."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SPEC = ROOT / "openapi" / "openapi.json"
TS_DIR = ROOT / "tests" / "typescript"
NODE_MODULES = TS_DIR / "node_modules"
# The generated types, imported by client.ts as "./cronhook" (gitignored where it is generated
# for an editor; this test generates its own copy).
GENERATED = "cronhook.d.ts"
# Together under pytest-timeout's 180 s, so a hang ends in subprocess.TimeoutExpired naming the
# command, not in a bare timeout. They take about 1 s and 4 to 7 s on two idle cores.
GENERATE_TIMEOUT_S = 50
TSC_TIMEOUT_S = 120


def type_check(spec: Path, workdir: Path) -> tuple[int, str]:
    """Generates the types of `spec` and compiles the client against them in `workdir` (a
    copy of tests/typescript: concurrent runs never share a generated file, and the worktree is
    not written). Returns tsc's exit code and its output."""
    for source in [*TS_DIR.glob("*.ts"), TS_DIR / "tsconfig.json"]:
        if source.name != GENERATED:
            shutil.copy(source, workdir / source.name)
    # Resolved through the link: the packages stay where `npm ci` put them.
    (workdir / "node_modules").symlink_to(NODE_MODULES, target_is_directory=True)
    generate = subprocess.run(
        [str(NODE_MODULES / ".bin" / "openapi-typescript"), str(spec), "--output", str(workdir / GENERATED)],
        capture_output=True, text=True, timeout=GENERATE_TIMEOUT_S, cwd=workdir,
    )  # fmt: skip
    # A document openapi-typescript cannot read is a failure of its own, before tsc.
    assert generate.returncode == 0, f"openapi-typescript failed:\n{generate.stdout}{generate.stderr}"
    tsc = subprocess.run(
        [str(NODE_MODULES / ".bin" / "tsc"), "-p", str(workdir)],
        capture_output=True, text=True, timeout=TSC_TIMEOUT_S, cwd=workdir,
    )  # fmt: skip
    # Run from the copy, tsc names client.ts(line,col) as in tests/typescript/.
    return tsc.returncode, tsc.stdout + tsc.stderr


def test_a_strict_typescript_client_type_checks_against_the_contract(tmp_path: Path) -> None:
    if not (NODE_MODULES / ".bin" / "tsc").exists() or shutil.which("node") is None:
        missing = "the TypeScript tools are not installed: run `make ts-deps` (Node 20 and npm)"
        # CI installs them (.ci/run); a skip there would pass a contract no client can use.
        if os.environ.get("CI") == "true":
            pytest.fail(missing)
        pytest.skip(missing)
    returncode, output = type_check(SPEC, tmp_path)
    assert returncode == 0, f"tsc --strict refused tests/typescript/client.ts against {SPEC}:\n{output}"


def test_the_readme_snippet_is_the_one_type_checked() -> None:
    # The README's TypeScript snippet ("## The API") is only as good as its check: its
    # statements are in client.ts (readmeSnippet) as written, so the test above compiles them.
    readme = README.read_text()
    snippet = re.search(r"^TypeScript client:.*?^```ts\n(.*?)^```", readme, re.S | re.M)
    assert snippet, "README.md: no ```ts block after the paragraph 'TypeScript client:'"
    client = {line.strip() for line in (TS_DIR / "client.ts").read_text().splitlines()}
    lines = [line.strip() for line in snippet.group(1).splitlines() if line.strip()]
    # Its imports are client.ts's too, with fewer names.
    statements = [line for line in lines if not line.startswith("import ")]
    assert statements, "README.md: the TypeScript snippet is empty"
    missing = [line for line in statements if line not in client]
    assert not missing, f"README.md's TypeScript lines not in tests/typescript/client.ts: {missing}"
