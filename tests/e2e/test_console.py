"""The web console in a real headless Chromium (Selenium, the system's chromium and
chromium-driver) against a live server: jobs by state, a job's runs and next fire times,
dead letters replayed one and in bulk, targets, and the cluster view with the admin key;
an open async attempt with its progress, then its reported result.

Screenshots go to the test's temp dir, or to CRONHOOK_UI_SCREENSHOTS (`docs` refreshes the
README's docs/console.png)."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

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
    # The system's driver: Selenium Manager would try to download one.
    return webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))


def _drive(server: LiveServer, shots: Path, cron_id: str, child_id: str, receiver_url: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    browser = _browser()
    wait = WebDriverWait(browser, 20)

    def loaded() -> None:
        wait.until(lambda b: "loaded" in (b.find_element(By.TAG_NAME, "body").get_attribute("class") or ""))

    def use_key(key: str) -> None:
        browser.find_element(By.ID, "key-input").send_keys(key)
        browser.find_element(By.CSS_SELECTOR, "#key-form button[type=submit]").click()

    try:
        browser.get(f"{server.url}/ui")
        assert "Enter an API key" in browser.find_element(By.ID, "error").text
        use_key(server.key)
        loaded()
        counts = {
            td.get_attribute("data-count"): td.text for td in browser.find_elements(By.CSS_SELECTOR, "[data-count]")
        }
        # The nightly report and the job chained after it are scheduled.
        assert (counts["scheduled"], counts["succeeded"], counts["dead"]) == ("2", "1", "1")
        assert len(browser.find_elements(By.CSS_SELECTOR, "#jobs tbody tr")) == 4
        browser.save_screenshot(str(shots / "console.png"))

        browser.find_element(By.CSS_SELECTOR, "[data-state=dead]").click()
        wait.until(ec.text_to_be_present_in_element((By.ID, "jobs-heading"), "Jobs: dead"))
        wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, "#jobs tbody tr")) == 1)

        browser.get(f"{server.url}/ui/jobs/{cron_id}")  # the key stays for the tab
        loaded()
        fires = browser.find_elements(By.CSS_SELECTOR, "#next-fires li")
        assert len(fires) == 5 and all(":00:00+" in li.text for li in fires)
        fields = browser.find_element(By.ID, "job-fields").text
        assert "nightly-report" in fields and "reports" in fields and "team=reports" in fields, fields
        browser.save_screenshot(str(shots / "console-job.png"))
        # Its chain: the job that runs after it, linked.
        assert not browser.find_element(By.ID, "chain").get_attribute("hidden")
        (child,) = browser.find_elements(By.CSS_SELECTOR, "#chain-children li")
        assert "load-warehouse" in child.text and "on success" in child.text
        child.find_element(By.TAG_NAME, "a").click()
        wait.until(ec.text_to_be_present_in_element((By.ID, "chain-parents"), "nightly-report"))
        assert browser.current_url.endswith(f"/ui/jobs/{child_id}")

        browser.get(f"{server.url}/ui/dead-letters")
        loaded()
        assert len(browser.find_elements(By.CSS_SELECTOR, "#dead-letters tbody tr")) == 1
        browser.find_element(By.CSS_SELECTOR, "#dead-letters tbody button").click()
        wait.until(ec.text_to_be_present_in_element((By.ID, "replay-result"), "replayed as"))
        wait.until(lambda b: b.find_element(By.CSS_SELECTOR, "#dead-letters tbody tr td:nth-child(8)").text == "yes")
        browser.find_element(By.ID, "replay-all").click()
        # Already replayed once: the bulk replay (not yet replayed only) has nothing left.
        wait.until(ec.text_to_be_present_in_element((By.ID, "replay-result"), "0 replayed"))
        browser.save_screenshot(str(shots / "console-dead-letters.png"))

        browser.get(f"{server.url}/ui/targets")
        loaded()
        assert receiver_url in browser.find_element(By.ID, "targets").text

        browser.get(f"{server.url}/ui/cluster")
        # A tenant's key is refused by the admin endpoint.
        wait.until(ec.text_to_be_present_in_element((By.ID, "error"), "403"))
        use_key(server.admin_key)
        wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, "#replicas tbody tr")) == 1)
        browser.save_screenshot(str(shots / "console-cluster.png"))
    finally:
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
        await http.post("/v1/jobs", json={"target_id": target["id"], "name": "welcome-email", "delay_s": 0.001})

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
        await asyncio.to_thread(_drive, server, shots, cron["id"], chained.json()["id"], receiver.url())
    assert (shots / "console.png").stat().st_size > 10_000
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
