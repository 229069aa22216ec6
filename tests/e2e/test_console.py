"""The web console in a real headless Chromium (Selenium, the system's chromium and
chromium-driver) against a live server: the overview's charts and totals drawn from the runs,
jobs filtered (state, search, target: in the URL) and sorted, a job's runs newest first and
paged with each run's detail, its next fire times, chain and edit, cancel behind a
confirmation, dead letters by name with edit-and-replay, bulk replay and delete, targets
edited and their secret rotated, the admin key's own page, every page at 390 px; an open
async attempt with its progress, then its reported result.

Screenshots go to the test's temp dir, or to CRONHOOK_UI_SCREENSHOTS (`docs` refreshes the
README's docs/console*.png)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from tests.e2e.live_server import LiveServer, live_server
from tests.e2e.test_processes import Processes
from tests.receiver import Receiver, Reply, wait_for

if TYPE_CHECKING:
    from selenium.webdriver.chrome.webdriver import WebDriver

pytestmark = pytest.mark.e2e

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
ROOT = Path(__file__).resolve().parents[2]


def _browser() -> WebDriver:
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip("no headless Chromium here: apt-get install chromium chromium-driver (.ci/run does in CI)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,800"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # The system's driver: Selenium Manager would try to download one.
    return webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))


NARROW = 390  # px: a phone held upright


def _browser_log(browser: WebDriver) -> list[Any]:
    """What the page's script logged (the driver's get_log is untyped)."""
    log: list[Any] = browser.get_log("browser")  # type: ignore[no-untyped-call]
    return log


def _drive(server: LiveServer, shots: Path, ids: dict[str, str], receiver_url: str) -> None:
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import Select, WebDriverWait

    browser = _browser()
    wait = WebDriverWait(browser, 20)
    http = httpx.Client(base_url=server.url, headers=server.auth, timeout=10)

    def loaded() -> None:
        try:
            wait.until(lambda b: "loaded" in (b.find_element(By.TAG_NAME, "body").get_attribute("class") or ""))
        except TimeoutException:
            # What the page said, and what its script logged: the failure's reason, not a timeout.
            said = browser.find_element(By.ID, "error").text
            raise AssertionError(f"{browser.current_url} did not load: {said!r} {_browser_log(browser)}") from None

    def use_key(key: str) -> None:
        browser.find_element(By.ID, "key-input").send_keys(key)
        browser.find_element(By.CSS_SELECTOR, "#key-form button[type=submit]").click()

    def open_page(path: str) -> None:
        browser.get(f"{server.url}{path}")
        loaded()

    def rows(table: str) -> list[Any]:
        return list(browser.find_elements(By.CSS_SELECTOR, f"#{table} tbody tr"))

    def confirm(yes: bool) -> None:
        wait.until(lambda b: b.find_element(By.ID, "confirm").get_attribute("open") is not None)
        browser.find_element(By.ID, "confirm-yes" if yes else "confirm-no").click()
        wait.until(lambda b: b.find_element(By.ID, "confirm").get_attribute("open") is None)

    def job(job_id: str) -> dict[str, Any]:
        body: dict[str, Any] = http.get(f"/v1/jobs/{job_id}").json()
        return body

    try:
        # The overview: charts and totals drawn from the runs (one delivered, one failed).
        browser.get(f"{server.url}/ui")
        assert "Enter an API key" in browser.find_element(By.ID, "error").text
        use_key(server.key)
        loaded()
        assert browser.current_url.endswith("/ui/overview")
        totals = {s.get_attribute("data-total"): s.text for s in browser.find_elements(By.CSS_SELECTOR, "[data-total]")}
        assert (totals["delivered"], totals["failed"], totals["failure_rate"]) == ("1", "1", "50.0%"), totals
        assert totals["lateness_p99_ms"].endswith(" ms"), totals
        chart = browser.find_element(By.ID, "chart-deliveries")
        assert chart.find_elements(By.CSS_SELECTOR, ".uplot canvas")
        points, delivered, failed = (chart.get_attribute(a) for a in ("data-points", "data-delivered", "data-failed"))
        assert (points, delivered, failed) == ("60", "1", "1")
        assert browser.find_elements(By.CSS_SELECTOR, "#chart-lateness .uplot canvas")
        (busiest,) = rows("busiest")
        assert busiest.text.split() == ["billing", "2", "1"], busiest.text
        failing = {j["name"] for j in http.get("/v1/jobs", params={"health": "failing"}).json()["items"]}
        shown = browser.find_element(By.ID, "failing").text
        assert all(name in shown for name in failing), (failing, shown)
        browser.save_screenshot(str(shots / "console-overview.png"))
        browser.find_element(By.CSS_SELECTOR, "[data-window='24h']").click()
        wait.until(lambda b: b.find_element(By.ID, "chart-deliveries").get_attribute("data-points") == "1440")

        # Jobs: counts by state, the filters in the URL, search, target and sorting.
        open_page("/ui/jobs")
        counts = {
            td.get_attribute("data-count"): td.text for td in browser.find_elements(By.CSS_SELECTOR, "[data-count]")
        }
        # The nightly report and the job chained after it are scheduled.
        assert (counts["scheduled"], counts["succeeded"], counts["dead"]) == ("2", "1", "1")
        assert len(rows("jobs")) == 4
        assert "billing" in rows("jobs")[0].text  # the target by name, not its id
        browser.save_screenshot(str(shots / "console.png"))
        browser.find_element(By.CSS_SELECTOR, "[data-state=dead]").click()
        wait.until(ec.text_to_be_present_in_element((By.ID, "jobs-heading"), "Jobs: dead"))
        wait.until(lambda b: len(rows("jobs")) == 1)
        assert "state=dead" in browser.current_url
        browser.find_element(By.ID, "filters-clear").click()
        loaded()
        search = browser.find_element(By.CSS_SELECTOR, "#filters [name=q]")
        search.send_keys("SYNC")
        search.submit()
        wait.until(lambda b: len(rows("jobs")) == 1 and "sync-crm" in rows("jobs")[0].text)
        assert "q=SYNC" in browser.current_url
        open_page("/ui/jobs?q=warehouse")  # a shared link: the filter comes from the URL
        assert browser.find_element(By.CSS_SELECTOR, "#filters [name=q]").get_attribute("value") == "warehouse"
        wait.until(lambda b: [r.text.split()[0] for r in rows("jobs")] == ["load-warehouse"])
        open_page(f"/ui/jobs?q={ids['welcome']}")  # by id
        wait.until(lambda b: len(rows("jobs")) == 1 and "welcome-email" in rows("jobs")[0].text)
        open_page("/ui/jobs")
        Select(browser.find_element(By.CSS_SELECTOR, "#filters [name=target]")).select_by_visible_text("billing")
        browser.find_element(By.CSS_SELECTOR, "#filters button[type=submit]").click()
        wait.until(ec.text_to_be_present_in_element((By.ID, "jobs-heading"), "to billing"))
        assert f"target={ids['target']}" in browser.current_url and len(rows("jobs")) == 4
        browser.find_element(By.CSS_SELECTOR, "#jobs th[data-sort=name]").click()
        names = [r.find_element(By.CSS_SELECTOR, "td a").text for r in rows("jobs")]
        assert names == sorted(names) and len(names) == 4, names
        browser.find_element(By.CSS_SELECTOR, "#jobs th[data-sort=name]").click()
        assert [r.find_element(By.CSS_SELECTOR, "td a").text for r in rows("jobs")] == sorted(names, reverse=True)

        # A job: next fire times, its set and labels, its chain, edit, runs newest first and paged.
        open_page(f"/ui/jobs/{ids['cron']}")
        fires = browser.find_elements(By.CSS_SELECTOR, "#next-fires li")
        assert len(fires) == 5 and all(":00:00+" in li.text for li in fires)
        fields = browser.find_element(By.ID, "job-fields").text
        assert "nightly-report" in fields and "reports" in fields and "team=reports" in fields, fields
        browser.save_screenshot(str(shots / "console-job.png"))
        browser.find_element(By.ID, "edit-toggle").click()
        priority = browser.find_element(By.CSS_SELECTOR, "#job-edit [name=priority]")
        priority.clear()
        priority.send_keys("5")
        browser.find_element(By.CSS_SELECTOR, "#job-edit button[type=submit]").click()
        wait.until(ec.text_to_be_present_in_element((By.ID, "notice"), "saved: priority"))
        assert job(ids["cron"])["priority"] == 5
        assert browser.find_element(By.CSS_SELECTOR, "#job-fields [data-field=priority]").text == "5"
        # 55 triggered occurrences: their runs are the report's, 50 to a page, newest first.
        for _ in range(55):
            assert http.post(f"/v1/jobs/{ids['cron']}/trigger").status_code == 201
        deadline = time.monotonic() + 30
        while len(http.get(f"/v1/jobs/{ids['cron']}/runs", params={"limit": 100}).json()["items"]) < 55:
            assert time.monotonic() < deadline, "55 triggered runs"
            time.sleep(0.2)
        newest = http.get(f"/v1/jobs/{ids['cron']}/runs", params={"limit": 1}).json()["items"][0]
        open_page(f"/ui/jobs/{ids['cron']}")
        assert len(rows("runs")) == 50
        first = rows("runs")[0]
        assert first.find_element(By.TAG_NAME, "time").get_attribute("datetime") == newest["scheduled_for"]
        browser.find_element(By.ID, "runs-more").click()
        wait.until(lambda b: len(rows("runs")) == 55)
        assert not browser.find_element(By.ID, "runs-more").is_displayed()
        rows("runs")[0].click()  # its detail
        detail = browser.find_element(By.CSS_SELECTOR, "#runs tr.detail").text
        assert "lateness" in detail and "success" in detail and "duration" in detail, detail
        # Its chain: the job that runs after it, linked.
        assert not browser.find_element(By.ID, "chain").get_attribute("hidden")
        (child,) = browser.find_elements(By.CSS_SELECTOR, "#chain-children li")
        assert "load-warehouse" in child.text and "on success" in child.text
        child.find_element(By.TAG_NAME, "a").click()
        wait.until(ec.text_to_be_present_in_element((By.ID, "chain-parents"), "nightly-report"))
        assert browser.current_url.endswith(f"/ui/jobs/{ids['child']}")
        loaded()
        # Cancel asks first: "keep it" keeps it.
        browser.find_element(By.CSS_SELECTOR, "[data-action=cancel]").click()
        confirm(yes=False)
        assert job(ids["child"])["state"] == "scheduled"
        browser.find_element(By.CSS_SELECTOR, "[data-action=cancel]").click()
        confirm(yes=True)
        wait.until(ec.text_to_be_present_in_element((By.ID, "notice"), "cancel: done"))
        assert job(ids["child"])["state"] == "cancelled"

        # Dead letters: the job's and target's names, edit and replay, bulk replay, delete.
        open_page("/ui/dead-letters")
        (letter,) = rows("dead-letters")
        assert "sync-crm" in letter.text and "billing" in letter.text, letter.text
        letter.find_element(By.XPATH, ".//button[text()='View / edit']").click()
        payload = browser.find_element(By.CSS_SELECTOR, "#dead-letter-view [name=payload]")
        kept = http.get(f"/v1/dead-letters/{letter.get_attribute('data-id')}").json()["payload"]
        wait.until(lambda b: (payload.get_attribute("value") or "").strip() != "")
        assert json.loads(payload.get_attribute("value") or "") == kept
        payload.clear()
        payload.send_keys('{"fixed": true}')
        browser.find_element(By.CSS_SELECTOR, "#dead-letter-view button[type=submit]").click()
        wait.until(ec.text_to_be_present_in_element((By.ID, "replay-result"), "with a new payload"))
        wait.until(lambda b: b.find_element(By.CSS_SELECTOR, "#dead-letters tbody tr td.replayed").text == "yes")
        replay_id = browser.find_element(By.CSS_SELECTOR, "#replay-result a").text
        assert http.get(f"/v1/jobs/{replay_id}").json()["payload"] == {"fixed": True}
        browser.find_element(By.ID, "replay-all").click()
        confirm(yes=True)
        # Already replayed once: the bulk replay (not yet replayed only) has nothing left.
        wait.until(ec.text_to_be_present_in_element((By.ID, "replay-result"), "0 replayed"))
        browser.save_screenshot(str(shots / "console-dead-letters.png"))
        rows("dead-letters")[0].find_element(By.XPATH, ".//button[text()='Delete']").click()
        confirm(yes=True)
        wait.until(lambda b: not rows("dead-letters"))
        assert http.get("/v1/dead-letters").json()["items"] == []

        # Targets: edit, rotate the secret with a grace period.
        open_page("/ui/targets")
        assert receiver_url in browser.find_element(By.ID, "targets").text
        rows("targets")[0].find_element(By.XPATH, ".//button[text()='Edit']").click()
        in_flight = browser.find_element(By.CSS_SELECTOR, "#target-edit [name=max_in_flight]")
        in_flight.clear()
        in_flight.send_keys("7")
        browser.find_element(By.CSS_SELECTOR, "#target-edit button[type=submit]").click()
        wait.until(ec.text_to_be_present_in_element((By.ID, "notice"), "max_in_flight"))
        assert http.get(f"/v1/targets/{ids['target']}").json()["max_in_flight"] == 7
        rows("targets")[0].find_element(By.XPATH, ".//button[text()='Rotate secret']").click()
        browser.find_element(By.CSS_SELECTOR, "#target-rotate button[type=submit]").click()
        confirm(yes=True)
        wait.until(ec.visibility_of_element_located((By.ID, "target-secret")))
        assert "whsec_" in browser.find_element(By.ID, "target-secret").text
        browser.save_screenshot(str(shots / "console-targets.png"))

        # The admin key: tenant pages say what it is for; the admin page works with it.
        use_key(server.admin_key)
        wait.until(ec.text_to_be_present_in_element((By.ID, "error"), "This is the admin key"))
        open_page("/ui/cluster")
        wait.until(lambda b: len(rows("replicas")) == 1)
        assert len(rows("api-keys")) >= 1
        browser.save_screenshot(str(shots / "console-cluster.png"))
        use_key(server.key)
        loaded()

        # Every page at a phone's width: nothing wider than the screen (tables scroll in their box).
        browser.set_window_size(NARROW, 844)
        inner = browser.execute_script("return window.innerWidth")
        for path in ("/ui/overview", "/ui/jobs", f"/ui/jobs/{ids['cron']}", "/ui/dead-letters", "/ui/targets"):
            open_page(path)
            width = browser.execute_script("return document.documentElement.scrollWidth")
            assert width <= inner, (path, width, inner)
            if path == "/ui/jobs":
                browser.save_screenshot(str(shots / "console-narrow.png"))
    except Exception as exc:
        # The failure with what the page said and what its script logged.
        said = browser.find_element(By.ID, "error").text
        raise AssertionError(f"{exc!r} on {browser.current_url}: {said!r} {_browser_log(browser)}") from exc
    finally:
        http.close()
        browser.quit()


async def test_the_console_in_headless_chromium(
    receiver: Receiver, db_url: str, procs: Processes, tmp_path: Path
) -> None:
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip("no headless Chromium here: apt-get install chromium chromium-driver (.ci/run does in CI)")
    shots = Path(os.environ.get("CRONHOOK_UI_SCREENSHOTS") or tmp_path)
    if not shots.is_absolute():
        shots = ROOT / shots
    async with (
        live_server(procs, db_url) as server,
        httpx.AsyncClient(base_url=server.url, headers=server.auth) as http,
    ):
        target = (await http.post("/v1/targets", json={"name": "billing", "url": receiver.url()})).json()
        # A named schedule in a set, with labels: the job page shows all three.
        put = await http.put(
            "/v1/schedule-sets/reports",
            json={
                "schedules": [
                    {
                        "key": "nightly-report",
                        "target_id": target["id"],
                        "name": "nightly-report",
                        "cron": "0 3 * * *",
                        "timezone": "Europe/Berlin",
                        "labels": {"team": "reports"},
                    }
                ]
            },
        )
        assert put.status_code == 200, put.text
        cron = (await http.get("/v1/schedules/nightly-report")).json()
        receiver.script = [Reply(status=200), Reply(status=410)]
        welcome = await http.post(
            "/v1/jobs", json={"target_id": target["id"], "name": "welcome-email", "delay_s": 0.001}
        )

        async def first_delivered() -> bool:
            return len(receiver.requests) == 1

        await wait_for(first_delivered, timeout=20, message="first delivery")
        await http.post(
            "/v1/jobs", json={"target_id": target["id"], "name": "sync-crm", "delay_s": 0.001, "max_attempts": 1}
        )

        async def dead_lettered() -> bool:
            return len((await http.get("/v1/dead-letters")).json()["items"]) == 1

        await wait_for(dead_lettered, timeout=20, interval=0.2, message="a dead letter")
        chained = await http.post(
            "/v1/jobs", json={"target_id": target["id"], "name": "load-warehouse", "after": {"job_id": cron["id"]}}
        )
        assert chained.status_code == 201, chained.text
        receiver.default = Reply(status=200)
        ids = {
            "target": target["id"],
            "cron": cron["id"],
            "child": chained.json()["id"],
            "welcome": welcome.json()["id"],
        }
        await asyncio.to_thread(_drive, server, shots, ids, receiver.url())
    for name in ("console-overview", "console", "console-job", "console-dead-letters", "console-targets"):
        assert (shots / f"{name}.png").stat().st_size > 10_000, name
    assert server.key not in procs.log("up") and server.admin_key not in procs.log("up")


def _drive_async(server: LiveServer, shots: Path, job_id: str, completion_url: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    browser = _browser()
    wait = WebDriverWait(browser, 20)

    def loaded() -> None:
        wait.until(lambda b: "loaded" in (b.find_element(By.TAG_NAME, "body").get_attribute("class") or ""))

    try:
        browser.get(f"{server.url}/ui/jobs")
        browser.find_element(By.ID, "key-input").send_keys(server.key)
        browser.find_element(By.CSS_SELECTOR, "#key-form button[type=submit]").click()
        loaded()
        assert "awaiting completion" in browser.find_element(By.CSS_SELECTOR, "#jobs tbody tr .state").text

        browser.get(f"{server.url}/ui/jobs/{job_id}")
        loaded()
        panel = browser.find_element(By.ID, "open-attempt")
        assert panel.is_displayed() and "awaiting completion" in panel.find_element(By.CSS_SELECTOR, ".badge").text
        assert browser.find_element(By.ID, "attempt-progress").get_attribute("value") == "40"
        assert browser.find_element(By.ID, "attempt-percent").text == "40%"
        assert browser.find_element(By.ID, "attempt-message").text == "halfway"
        deadline = browser.find_element(By.CSS_SELECTOR, "#attempt-fields [data-field=deadline]").text
        assert deadline.startswith("20") and deadline.endswith("Z")
        (open_run,) = browser.find_elements(By.CSS_SELECTOR, "#runs tbody tr")
        assert "awaiting completion" in open_run.find_element(By.CSS_SELECTOR, ".outcome .badge").text
        assert open_run.find_element(By.CSS_SELECTOR, ".result").text == f"40% “halfway” · deadline {deadline}"
        # The job overrides one setting of its target (the rest are the target's).
        assert "the target's (heartbeat 300s)" in browser.find_element(By.ID, "job-fields").text
        browser.save_screenshot(str(shots / "console-async.png"))

        # The receiver reports; the page, refreshing itself while the attempt is open, shows the result.
        done = httpx.post(completion_url, json={"outcome": "succeeded", "result": {"rows": 12}})
        assert done.status_code == 204, done.text
        wait.until(ec.invisibility_of_element_located((By.ID, "open-attempt")))
        wait.until(ec.text_to_be_present_in_element((By.CSS_SELECTOR, "#runs tbody tr .result"), '{"rows":12}'))
        assert browser.find_element(By.CSS_SELECTOR, "#runs tbody tr .outcome").text == "success"

        browser.get(f"{server.url}/ui/targets")
        loaded()
        assert browser.find_element(By.CSS_SELECTOR, "#targets .completion").text == "async (timeout 600s)"
    finally:
        browser.quit()


async def test_an_open_async_attempt_in_the_console(
    receiver: Receiver, db_url: str, procs: Processes, tmp_path: Path
) -> None:
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip("no headless Chromium here: apt-get install chromium chromium-driver (.ci/run does in CI)")
    shots = Path(os.environ.get("CRONHOOK_UI_SCREENSHOTS") or tmp_path)
    if not shots.is_absolute():
        shots = ROOT / shots
    receiver.default = Reply(status=202, body=b"")
    async with (
        live_server(procs, db_url) as server,
        httpx.AsyncClient(base_url=server.url, headers=server.auth) as http,
    ):
        target = (
            await http.post(
                "/v1/targets",
                json={"name": "exports", "url": receiver.url(), "completion": "async", "async_timeout_s": 600},
            )
        ).json()
        job = (
            await http.post(
                "/v1/jobs",
                json={"target_id": target["id"], "name": "export", "delay_s": 0.001, "heartbeat_timeout_s": 300},
            )
        ).json()

        async def awaiting() -> bool:
            return bool((await http.get(f"/v1/jobs/{job['id']}")).json()["awaiting_completion"])

        await wait_for(awaiting, timeout=20, interval=0.2, message="the 202 leaves the attempt open")
        completion_url = receiver.requests[0].headers["cronhook-completion-url"]
        beat = await http.post(f"{completion_url}/heartbeat", json={"progress": 40, "message": "halfway"})
        assert beat.status_code == 204, beat.text
        await asyncio.to_thread(_drive_async, server, shots, job["id"], completion_url)
    assert (shots / "console-async.png").stat().st_size > 10_000
