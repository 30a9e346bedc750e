"""The jobs console in a real headless Chromium, on a real cluster: the API, a Celery
worker, the strict mock provider (failing some calls), PostgreSQL and Redis.

A person signs in with an API key, sees their jobs (not another tenant's), opens a
running job and watches its bar move without reloading, opens its errors (with the
input's line numbers), cancels it and sees it end cancelled; the pages fit a phone's
width. With QUOTAFLOW_UPDATE_SCREENSHOTS=1 the screenshots replace docs/console-*.png.
"""

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select

from quotaflow.models import Result
from quotaflow.tenants import keys as auth
from tests.harness.browser import Browser
from tests.harness.cluster import start_provider, start_workers
from tests.harness.factories import chat_line, jsonl
from tests.harness.procs import Proc, free_port, quotaflow
from tests.harness.servers import REDIS_URL, ROOT, flush_redis, service_env

LINES = 240  # at 4 requests a second: a minute, if it is not cancelled


@dataclass
class Console:
    url: str
    workdir: Path

    def submit(self, key: str, lines: list[dict], name: str, queue: str = "standard") -> str:
        answer = httpx.post(f"{self.url}/jobs", headers={"Authorization": f"Bearer {key}"},
                            files={"file": (name, jsonl(lines))}, data={"queue": queue},
                            timeout=60)
        assert answer.status_code == 201, answer.text
        return answer.json()["id"]

    def job(self, key: str, job_id: str) -> dict:
        return httpx.get(f"{self.url}/jobs/{job_id}", timeout=10,
                         headers={"Authorization": f"Bearer {key}"}).json()


@pytest.fixture(scope="module")
def console(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    workdir = tmp_path_factory.mktemp("console")
    flush_redis(REDIS_URL)
    procs: list[Proc] = []
    try:
        provider, provider_url = start_provider(workdir, "--rpm", "60000", "--tpm", "50000000",
                                                "--latency-ms", "50", "--fault", "500=0.15")
        procs.append(provider)
        deployments = workdir / "deployments.toml"
        deployments.write_text(  # 4 requests a second: slow enough to watch
            f'[deployments.paced]\nprovider = "openai"\nbase_url = "{provider_url}/v1"\n'
            'model = "paced"\nrpm = 240\ntpm = 10000000\nburst_seconds = 1\n'
            '[routes]\n"*" = "paced"\n')
        port = free_port()
        env = service_env(QUOTAFLOW_DATABASE_URL=pg_url, QUOTAFLOW_BROKER_URL=REDIS_URL,
                          QUOTAFLOW_DEPLOYMENTS_FILE=str(deployments),
                          QUOTAFLOW_PROVIDER_MAX_ATTEMPTS="1", QUOTAFLOW_BATCH_SIZE="40",
                          QUOTAFLOW_FLOWER_URL="http://127.0.0.1:5555",
                          QUOTAFLOW_GRAFANA_URL="http://127.0.0.1:3000")
        api = Proc("api", quotaflow("api", "--port", str(port)), env, workdir)
        procs.append(api)
        procs.extend(start_workers(env, workdir, "console", count=1, concurrency=2))
        api.wait_http(f"http://127.0.0.1:{port}/healthz")
        yield Console(f"http://127.0.0.1:{port}", workdir)
    finally:
        for proc in reversed(procs):
            proc.stop()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    opened = Browser(tmp_path)
    try:
        yield opened
    finally:
        opened.close()


def keep_screenshot(shot: Path) -> None:
    if os.environ.get("QUOTAFLOW_UPDATE_SCREENSHOTS") == "1":
        shutil.copyfile(shot, ROOT / "docs" / shot.name)


def test_sign_in_watch_a_job_open_its_errors_and_cancel_it(
        console: Console, browser: Browser, pg_sessions, tmp_path: Path) -> None:
    key = auth.create_key(pg_sessions, "acme").secret
    other_key = auth.create_key(pg_sessions, "globex").secret
    small = console.submit(key, [chat_line(f"s{i}", model="paced") for i in range(8)],
                           "warmup.jsonl", queue="realtime")
    theirs = console.submit(other_key, [chat_line("x", model="paced")], "theirs.jsonl")
    running = console.submit(key, [chat_line(f"r{i}", model="paced") for i in range(LINES)],
                             "survey.jsonl", queue="bulk")

    # Signed out, the console is its sign-in form, its field labelled
    browser.goto(f"{console.url}/console")
    assert browser.evaluate("location.pathname") == "/console/login"
    assert browser.text("label[for=api_key]") == "API key"
    browser.fill("#api_key", key)
    browser.click("form button[type=submit]")
    browser.settled()
    # Then the tenant's jobs: its own, not the other tenant's
    assert browser.evaluate("location.pathname") == "/console/jobs"
    browser.wait_for(f"!!document.querySelector('tr[data-job=\"{running}\"]')")
    assert browser.evaluate(f"!!document.querySelector('tr[data-job=\"{small}\"]')")
    assert not browser.evaluate(f"!!document.querySelector('tr[data-job=\"{theirs}\"]')")
    assert browser.evaluate("[...document.querySelectorAll('input:not([type=hidden]), select, "
                            "progress')].every(e => e.labels.length || "
                            "e.getAttribute('aria-label'))")
    browser.wait_for("document.querySelector('tr[data-job] progress').value > 0", 30)
    list_shot = tmp_path / "console-jobs.png"
    browser.screenshot(list_shot)

    # The running job's bar moves while the page stays (live, no reload)
    browser.click(f"a[href='/console/jobs/{running}']")
    browser.settled()
    browser.evaluate("window.sameDocument = true")
    first = browser.evaluate("document.getElementById('job-progress').value")
    browser.wait_for(f"document.getElementById('job-progress').value > {first} + 2", 30)
    assert browser.evaluate("window.sameDocument === true")
    # Failures show: reopened, the page lists the first errors with their line numbers
    browser.wait_for("Number(document.getElementById('count-failed').innerText) >= 2", 40)
    # (batches end in any order: an earlier line may fail while the page is made, so the
    # page's first error lies between the first failed line before and after it)
    before = first_failed(pg_sessions, running)
    browser.goto(f"{console.url}/console/jobs/{running}")
    browser.click("#errors summary")
    assert browser.evaluate("document.getElementById('errors').open")
    shown = browser.evaluate("[...document.querySelectorAll('#errors tbody tr')]"
                             ".map(r => Number(r.cells[0].innerText))")
    after = first_failed(pg_sessions, running)
    assert shown and shown == sorted(shown) and after <= shown[0] <= before, (
        shown, before, after)
    assert "provider_error" in browser.text("#errors tbody")
    # The report's plots load into the page; what bound it is said
    browser.wait_for("document.querySelectorAll('#plots figure svg').length === 4", 60)
    browser.wait_for("document.querySelector('#bound[data-cause=\"budget\"]') !== null", 30)
    assert "the budget is the limit" in browser.text("#bound")
    job_shot = tmp_path / "console-job.png"
    browser.screenshot(job_shot)

    # Cancel: the button posts the form (with its token); the job ends cancelled
    browser.click("#cancel")
    browser.settled()
    browser.wait_for("document.getElementById('job-status').innerText === 'cancelled'", 60)
    assert console.job(key, running)["status"] == "cancelled"
    assert not browser.evaluate("!!document.getElementById('cancel')")

    # On a phone's width nothing spills sideways: the table scrolls in its own box
    browser.resize(390, 844, mobile=True)
    browser.goto(f"{console.url}/console/jobs")
    assert browser.evaluate("document.documentElement.scrollWidth") <= 390
    browser.goto(f"{console.url}/console/jobs/{running}")
    assert browser.evaluate("document.documentElement.scrollWidth") <= 390
    for shot in (list_shot, job_shot):
        keep_screenshot(shot)


def first_failed(sessions, job_id: str) -> int:
    """The job's first failed line now."""
    with sessions() as session:
        return session.scalar(select(func.min(Result.line_no)).where(
            Result.job_id == job_id, Result.error.is_not(None)))
