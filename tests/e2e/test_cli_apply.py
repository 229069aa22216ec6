"""`cronhook apply|diff|export` against a live server, as a user runs them from a shell: a file
applied twice changes nothing the second time (the schedules keep their next fire times), an
edit changes only what it edits, a dry run writes nothing, --prune cancels what the file no
longer has, diff's exit status says whether anything would change, an export applied back
changes nothing and holds no secret, and every mistake names the file's line and field."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.live_server import LiveServer, live_server
from tests.e2e.test_processes import CRONHOOK, Processes, base_env
from tests.receiver import Receiver

pytestmark = pytest.mark.e2e

CLI_TIMEOUT_S = 60.0
SECRET_LINE = "store this secret now; it is shown once"

# Nothing here fires while the test runs (deliveries are not what is tested): the interval's
# first fire is a week away, the crons' once a year.
SCHEDULES = """\
set: nightly
targets:
  billing:
    url: {url}
    timeout_s: 5
schedules:
  report:
    target: billing
    cron: "H 3 1 1 *"
    timezone: Europe/Berlin
    payload: {{report: daily}}
  cleanup:
    target: billing
    every_s: 604800
    jitter_s: 60
  yearly:
    target: ops
    cron: "0 0 1 1 *"
    max_attempts: 3
"""


async def run(server: LiveServer, *args: str, cwd: Path | None = None) -> tuple[int, str, str]:
    env = base_env(CRONHOOK_URL=server.url, CRONHOOK_API_KEY=server.key)
    proc = await asyncio.create_subprocess_exec(
        CRONHOOK, *args, env=env, cwd=cwd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), CLI_TIMEOUT_S)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def ok(server: LiveServer, *args: str) -> str:
    code, out, err = await run(server, *args)
    assert code == 0, (args, out, err)
    return out


async def schedules(http: httpx.AsyncClient, server: LiveServer, *keys: str) -> dict[str, dict[str, Any]]:
    """Each key's job (GET /v1/schedules/{key}): its id, payload, state and next_run_at."""
    found = {}
    for key in keys:
        response = await http.get(f"{server.url}/v1/schedules/{key}", headers=server.auth)
        assert response.status_code == 200, response.text
        found[key] = response.json()
    return found


def next_runs(jobs: dict[str, dict[str, Any]]) -> dict[str, str]:
    return {key: job["next_run_at"] for key, job in jobs.items()}


async def test_apply_changes_only_what_the_file_changes(
    receiver: Receiver, db_url: str, procs: Processes, tmp_path: Path
) -> None:
    async with live_server(procs, db_url) as server, httpx.AsyncClient() as http:
        await ok(server, "targets", "create", "--name", "ops", "--url", receiver.url("/ops"))
        path = tmp_path / "nightly.yaml"
        path.write_text(SCHEDULES.format(url=receiver.url()))

        code, out, err = await run(server, "apply", "-f", str(path))
        assert code == 0, (out, err)
        assert out.splitlines() == [
            "+ target billing (created)",
            "+ report",
            "+ cleanup",
            "+ yearly",
            "set nightly: 3 created",
        ]
        assert SECRET_LINE in err and "whsec_" in err and "whsec_" not in out
        created = await schedules(http, server, "report", "cleanup", "yearly")
        assert created["report"]["payload"] == {"report": "daily"} and created["yearly"]["max_attempts"] == 3

        # Again: nothing is written, nothing moves.
        out = await ok(server, "apply", "-f", str(path))
        assert out.splitlines() == ["= target billing", "= report", "= cleanup", "= yearly", "set nightly: 3 unchanged"]
        assert next_runs(await schedules(http, server, *created)) == next_runs(created)
        code, out, _ = await run(server, "diff", "-f", str(path))
        assert code == 0 and out.splitlines()[2:] == ["= target billing", "= report", "= cleanup", "= yearly"]
        assert out.splitlines()[:2] == [f"--- {server.url} set nightly", f"+++ {path}"]

        # One payload edited: diff says so (exit 1), a dry run writes nothing, apply changes it alone.
        path.write_text(SCHEDULES.format(url=receiver.url()).replace("report: daily", "report: weekly"))
        code, out, err = await run(server, "diff", "-f", str(path))
        assert code == 1 and "~ report (payload)" in out.splitlines(), (out, err)
        assert err.strip() == f"cronhook: {path}: 1 change(s) to make (cronhook apply -f {path})"
        out = await ok(server, "apply", "-f", str(path), "--dry-run")
        assert (
            "~ report (payload)" in out and "set nightly (dry run: nothing was written): 1 changed, 2 unchanged" in out
        )
        assert (await schedules(http, server, "report"))["report"]["payload"] == {"report": "daily"}
        out = await ok(server, "apply", "-f", str(path))
        assert out.splitlines()[:4] == ["= target billing", "~ report (payload)", "= cleanup", "= yearly"]
        edited = await schedules(http, server, *created)
        assert edited["report"]["payload"] == {"report": "weekly"}
        assert next_runs(edited) == next_runs(created)

        # A schedule taken out of the file: kept without --prune, cancelled with it.
        path.write_text(
            path.read_text().replace("  cleanup:\n    target: billing\n    every_s: 604800\n    jitter_s: 60\n", "")
        )
        out = await ok(server, "apply", "-f", str(path))
        assert "cleanup" not in out and (await schedules(http, server, "cleanup"))["cleanup"]["state"] == "scheduled"
        code, out, _ = await run(server, "diff", "-f", str(path), "--prune")
        assert code == 1 and "- cleanup" in out.splitlines()
        out = await ok(server, "apply", "-f", str(path), "--prune", "--json")
        answer = json.loads(out)
        assert answer["schedules"]["pruned"] == ["cleanup"] and answer["schedules"]["unchanged"] == ["report", "yearly"]
        assert answer["targets"]["billing"]["outcome"] == "unchanged" and answer["targets"]["billing"]["changed"] == []
        cancelled = await http.get(f"{server.url}/v1/jobs/{created['cleanup']['id']}", headers=server.auth)
        assert cancelled.json()["state"] == "cancelled"
        assert next_runs(await schedules(http, server, "report", "yearly")) == {
            key: created[key]["next_run_at"] for key in ("report", "yearly")
        }
        assert (await run(server, "diff", "-f", str(path), "--prune"))[0] == 0

        # A dry run with a target that does not exist yet: reported, nothing created.
        path.write_text(
            path.read_text().replace("targets:\n", f"targets:\n  archive:\n    url: {receiver.url('/archive')}\n")
            + "  archived:\n    target: archive\n    every_s: 86400\n"
        )
        code, out, err = await run(server, "apply", "-f", str(path), "--dry-run")
        assert code == 0, (out, err)
        assert "+ target archive (would be created)" in out.splitlines()
        assert "? archived (target archive would be created first; not checked till then)" in out.splitlines()
        assert "set nightly (dry run: nothing was written): 2 unchanged, 1 not checked" in out
        assert (await http.get(f"{server.url}/v1/targets/by-name/archive", headers=server.auth)).status_code == 404
        assert (await http.get(f"{server.url}/v1/schedules/archived", headers=server.auth)).status_code == 404
        assert (await run(server, "diff", "-f", str(path)))[0] == 1


async def test_an_export_applied_back_changes_nothing_and_holds_no_secret(
    receiver: Receiver, db_url: str, procs: Processes, tmp_path: Path
) -> None:
    async with live_server(procs, db_url) as server:
        # A target with a header: its value is never shown, so the export leaves it to the server.
        await ok(
            server, "targets", "create", "--name", "ops", "--url", receiver.url("/ops"), "--header", "X-Token=s3cret"
        )
        path = tmp_path / "nightly.yaml"
        path.write_text(SCHEDULES.format(url=receiver.url()))
        await ok(server, "apply", "-f", str(path))
        run_at = (dt.datetime.now(dt.UTC) + dt.timedelta(days=200)).replace(microsecond=0).isoformat()
        report = json.loads(await ok(server, "export", "--set", "nightly", "--json"))["schedules"]["report"]
        assert report["target"] == "billing" and report["payload"] == {"report": "daily"}
        # More of a job's fields, a chain among them (`on` is a plain YAML key), in a second set.
        jobs = await ok(server, "jobs", "list", "--json")
        report_id = next(job["id"] for job in json.loads(jobs)["items"] if job.get("key") == "report")
        other = tmp_path / "weekly.yaml"
        other.write_text(
            f"schedules:\n"
            f"  once:\n    target: billing\n    run_at: {run_at}\n"
            "    payload: {nested: {list: [1, 2.5, 'on', null]}}\n"
            f"  after-report:\n    target: ops\n    after: {{job_id: {report_id}, on: failure}}\n"
            f"  spread:\n    target: ops\n    every_s: 3600\n    jitter_s: 30\n    misfire_policy: skip\n"
            f"    priority: 5\n    name: Spread\n"
        )
        code, out, err = await run(server, "apply", "-f", str(other))
        assert code == 0, (out, err)
        assert out.splitlines()[-1] == "set weekly: 3 created"

        for exported_set in ("nightly", "weekly"):
            exported = tmp_path / f"exported-{exported_set}.yaml"
            await ok(server, "export", "--set", exported_set, "-o", str(exported))
            text = exported.read_text()
            assert "whsec_" not in text and "s3cret" not in text
            assert f"set: {exported_set}\n" in text and "  ops:" not in text.split("schedules:")[0]
            assert "# Target 'ops' is not defined here" in text
            code, out, err = await run(server, "apply", "-f", str(exported))
            assert code == 0, (text, out, err)
            assert all(line.startswith("= ") for line in out.splitlines()[:-1]), (text, out)
            assert (await run(server, "diff", "-f", str(exported), "--prune"))[0] == 0
        exported_text = (tmp_path / "exported-weekly.yaml").read_text()
        assert "on: failure" in exported_text or "'on': failure" in exported_text

        # Without --set: every named schedule, and no `set:`.
        everything = await ok(server, "export")
        assert "\nset:" not in everything and "after-report:" in everything and "yearly:" in everything


async def test_mistakes_name_the_file_line_and_field(
    receiver: Receiver, db_url: str, procs: Processes, tmp_path: Path
) -> None:
    async with live_server(procs, db_url) as server:
        path = tmp_path / "nightly.yaml"
        await ok(server, "targets", "create", "--name", "ops", "--url", receiver.url("/ops"))
        # The server's refusal: line 9 holds the report's cron.
        path.write_text(SCHEDULES.format(url=receiver.url()).replace("H 3 1 1 *", "61 * * * *"))
        code, _, err = await run(server, "apply", "-f", str(path))
        # The targets were put first (the new one's secret is shown), the set refused whole.
        secret, mistake, refusal = err.splitlines()
        assert code == 1 and SECRET_LINE in secret, err
        assert mistake.startswith(f"{path}:9: schedules.report.cron: invalid cron expression '61 * * * *'"), err
        assert refusal.startswith(f"cronhook: {server.url} answered 422 "), err
        listed = await ok(server, "export", "--set", "nightly", "--json")
        assert json.loads(listed)["schedules"] == {}
        code, _, err = await run(server, "diff", "-f", str(path))
        assert code == 2 and err.splitlines()[0].startswith(f"{path}:9: schedules.report.cron: "), err

        # Found before anything is sent: exit 2, every mistake, in the file's order.
        path.write_text(
            "set: nightly\nowner: me\nschedules:\n  a:\n    target: nowhere\n    every_s: 60\n"
            "  b:\n    every_s: 60\n  a:\n    target: x\n"
        )
        code, _, err = await run(server, "apply", "-f", str(path))
        assert code == 2 and err.splitlines() == [
            f"{path}:2: owner: unknown key: a file holds set, targets, schedules",
            f"{path}:7: schedules.b: needs a target (a target's name)",
            f"{path}:9: schedules.a: given twice (first on line 4)",
            f"cronhook: {path}: 3 error(s); nothing was written",
        ], err
        path.write_text("set: nightly\nschedules:\n  a:\n    target: nowhere\n    every_s: 60\n")
        code, _, err = await run(server, "apply", "-f", str(path))
        assert code == 2 and err.splitlines()[0] == f"{path}:4: schedules.a.target: no target is named 'nowhere'", err

        # A target's refusal, and a key of another set (409): their lines.
        path.write_text(f"targets:\n  bad:\n    url: {receiver.url()}\n    timeout_s: -1\n")
        code, _, err = await run(server, "apply", "-f", str(path))
        assert code == 1 and err.splitlines()[0].startswith(f"{path}:4: targets.bad.timeout_s: "), err
        first, second = tmp_path / "first.yaml", tmp_path / "second.yaml"
        first.write_text(
            f"targets:\n  t:\n    url: {receiver.url()}\nschedules:\n  shared:\n    target: t\n    every_s: 600\n"
        )
        second.write_text(
            "schedules:\n  mine:\n    target: t\n    every_s: 60\n  shared:\n    target: t\n    every_s: 600\n"
        )
        await ok(server, "apply", "-f", str(first))
        code, _, err = await run(server, "apply", "-f", str(second))
        assert code == 1 and err.splitlines()[0] == (
            f"{second}:5: schedules.shared: the schedule 'shared' belongs to the set 'first'"
        ), err
        assert (await run(server, "apply", "-f", str(tmp_path / "missing.yaml")))[0] == 2
