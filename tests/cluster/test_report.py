"""The job report: served by GET /jobs/{id}/report for its tenant only, opened in a real
headless browser (Debian's chromium), its plots present and their series equal to what
the database holds."""

import json
import math
import shutil
import subprocess
from collections import Counter, defaultdict
from html.parser import HTMLParser
from pathlib import Path
from statistics import quantiles
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from api import deps
from api.app import create_app
from quotaflow.budget.buckets import make_limiter
from quotaflow.config import get_settings
from quotaflow.models import Result
from quotaflow.observe import report, report_data
from quotaflow.tenants import keys as auth
from tests.cluster.test_provenance import mock_deployments, run_job  # noqa: F401  (a fixture)

PLOTS = ("requests", "tokens", "outcomes", "latency", "split")


class Figures(HTMLParser):
    """The report's <figure class="plot"> elements as the browser's DOM has them, and
    whether each holds an <svg> with drawn paths."""

    def __init__(self) -> None:
        super().__init__()
        self.figures: dict[str, dict[str, Any]] = {}
        self._open: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "figure" and values.get("class") == "plot":
            self._open = str(values["id"]).removeprefix("plot-")
            self.figures[self._open] = {**values, "svg": 0, "paths": 0}
        elif self._open and tag in ("svg", "path"):
            self.figures[self._open]["svg" if tag == "svg" else "paths"] += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "figure":
            self._open = None


def browser_dom(page: Path, screenshot: Path | None = None) -> str:
    """The page's DOM after Chromium loaded it, offline (and a screenshot if asked)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (scripts/test installs it)")
    flags = ["--headless", "--disable-gpu", "--no-sandbox", "--disable-dev-shm-usage",
             "--no-first-run", f"--user-data-dir={page.parent / 'chromium-profile'}"]
    if screenshot is not None:
        subprocess.run([chromium, *flags, f"--screenshot={screenshot}",
                        "--window-size=1280,2600", "--hide-scrollbars", page.as_uri()],
                       check=True, capture_output=True, timeout=120)
    done = subprocess.run([chromium, *flags, "--dump-dom", page.as_uri()], check=True,
                          capture_output=True, text=True, timeout=120)
    return done.stdout


def expected_series(rows: list[Result], width: int) -> dict[str, list[dict[str, Any]]]:
    """The plots' series computed again, in Python, from the stored rows."""
    def bucket(moment: Any) -> float:
        return float(math.floor(moment.timestamp() / width) * width)

    per_min = 60.0 / width
    admitted: dict[str, Counter[float]] = defaultdict(Counter)
    tokens: dict[str, Counter[float]] = defaultdict(Counter)
    outcomes: dict[bool, Counter[float]] = {True: Counter(), False: Counter()}
    latencies: dict[float, list[float]] = defaultdict(list)
    for row in rows:
        if row.admitted_at is not None:
            admitted[row.deployment][bucket(row.admitted_at)] += 1
            tokens[row.deployment][bucket(row.admitted_at)] += (row.prompt_tokens
                                                                 + row.completion_tokens)
        outcomes[row.error is None][bucket(row.answered_at or row.created_at)] += 1
        if row.answered_at is not None:
            latencies[bucket(row.answered_at)].append(
                (row.answered_at - row.sent_at).total_seconds())

    def series(name: str, counts: Counter[float], keys: list[float]) -> dict[str, Any]:
        return {"name": name, "x": keys, "y": [counts[k] * per_min for k in keys]}

    every = sorted(set(outcomes[True]) | set(outcomes[False]))
    times = sorted(latencies)
    return {
        "requests": [series(d, c, sorted(c)) for d, c in sorted(admitted.items())],
        "tokens": [series(d, c, sorted(c)) for d, c in sorted(tokens.items())],
        "outcomes": [series("completed", outcomes[True], every),
                     series("failed", outcomes[False], every)],
        "latency": [{"name": "p50", "x": times, "y": [_pct(latencies[t], 0.5) for t in times]},
                    {"name": "p95", "x": times,
                     "y": [_pct(latencies[t], 0.95) for t in times]}],
    }


def _pct(values: list[float], q: float) -> float:
    """PostgreSQL's percentile_cont: linear between the closest ranks."""
    if len(values) == 1:
        return values[0]
    cuts = quantiles(values, n=100, method="inclusive")
    return cuts[round(q * 100) - 1]


def test_the_report_opens_offline_in_a_browser_and_matches_the_database(
        pg_sessions, settings, mock_deployments, tmp_path) -> None:  # noqa: F811
    # Given a job run against the mock provider, some of whose calls fail for good
    settings.deployments_file = mock_deployments
    settings.provider_max_attempts = 2
    job = run_job(pg_sessions, settings, 120)
    with pg_sessions() as session:
        data = report_data.report_data(session, job.id,
                                       report_data.budgets(settings.load_deployments()))
        rows = session.scalars(select(Result).where(Result.job_id == job.id)).all()
    page = tmp_path / "report.html"
    page.write_text(report.render(data), encoding="utf-8")
    # When Chromium opens the page from disk, with no network
    parser = Figures()
    parser.feed(browser_dom(page))
    # Then every plot is there, drawn as SVG
    assert set(parser.figures) == set(PLOTS)
    for name, figure in parser.figures.items():
        assert figure["svg"] == 1 and figure["paths"] > 5, name
    # And each plotted series is what the database holds
    width = int(parser.figures["requests"]["data-bucket-s"])
    want = expected_series(list(rows), width)
    for name in ("requests", "tokens", "outcomes", "latency"):
        got = json.loads(parser.figures[name]["data-series"])
        assert [s["name"] for s in got] == [s["name"] for s in want[name]], name
        for mine, theirs in zip(got, want[name], strict=True):
            assert mine["x"] == theirs["x"], name
            assert mine["y"] == pytest.approx(theirs["y"], rel=1e-6, abs=1e-6), name
    assert json.loads(parser.figures["requests"]["data-budgets"]) == {"mock-http": 60000}
    split = json.loads(parser.figures["split"]["data-series"])
    assert split == [{"name": "mock-http", "requests": 120,
                      "succeeded": sum(r.error is None for r in rows)}]
    assert sum(s["succeeded"] for s in split) < 120  # some gave up: an error table too


def test_the_report_route_serves_html_to_its_tenant_only(pg_sessions, settings,
                                                         mock_deployments,  # noqa: F811
                                                         monkeypatch) -> None:
    settings.deployments_file = mock_deployments
    job = run_job(pg_sessions, settings, 10)
    mine = auth.create_key(pg_sessions, "default").secret
    theirs = auth.create_key(pg_sessions, "someone-else").secret
    monkeypatch.setattr(deps, "get_settings", lambda: settings)
    app = create_app()
    app.dependency_overrides[get_settings] = lambda: settings
    app.dependency_overrides[deps.deployments] = settings.load_deployments
    app.dependency_overrides[deps.limiter] = lambda: make_limiter(settings.limiter_url)
    with TestClient(app) as client:
        answer = client.get(f"/jobs/{job.id}/report",
                            headers={"Authorization": f"Bearer {mine}"})
        other = client.get(f"/jobs/{job.id}/report",
                           headers={"Authorization": f"Bearer {theirs}"})
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/html")
    # Self-contained: nothing to fetch, nothing to run
    assert answer.text.count("<svg") == len(PLOTS)
    assert not any(s in answer.text for s in ('src="http', 'href="http', "<script", "@import"))
    assert other.status_code == 404
