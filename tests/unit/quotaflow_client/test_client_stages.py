"""Stages in process: generate, then judge the answers, as two submits of the client and
as two `quotaflow run`s; the second stage's prompts hold the first stage's answers."""

import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from cli.main import main
from quotaflow import Client
from quotaflow.config import Settings, get_settings
from quotaflow.errors import TableError


@pytest.fixture
def client(tmp_path: Path) -> Iterator[Client]:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'embedded.db'}",
                        deployments_file=None)
    with Client.embedded(settings, quiet=True) as made:
        yield made


def test_generate_then_judge(client: Client) -> None:
    cities = [{"city": c} for c in ("Oslo", "Lima")]
    first = client.submit(cities, template="A fact about {{ city }}", model="m").wait()
    judge = client.submit(after=first, template="Judge the fact about {{ city }}: "
                                                "{{ response_text }}", model="judge")
    assert judge.data["metadata"]["quotaflow_after"] == first.id
    rows = list(judge.wait().results())
    assert [(r["city"], r["custom_id"], r["response_text"]) for r in rows] == [
        (c, str(n), f"simulated reply to: Judge the fact about {c}: "
                    f"simulated reply to: A fact about {c}")
        for n, c in enumerate(("Oslo", "Lima"), 1)]
    assert [r["previous_response_text"] for r in rows] == [
        "simulated reply to: A fact about Oslo", "simulated reply to: A fact about Lima"]
    again = client.jobs.get(judge.id)  # found again by its metadata: the previous job
    assert [r["response_text"] for r in again.results()] == [r["response_text"] for r in rows]
    with pytest.raises(TableError, match="a stage takes after=job and a template"):
        client.submit(after=first.id)


def _run(*args: str) -> int:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", ["quotaflow", *args])
        try:
            main()
        except SystemExit as ended:
            return int(ended.code or 0)
    return 0


def test_run_after(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("QUOTAFLOW_DATABASE_URL", f"sqlite:///{tmp_path / 'run.db'}")
    monkeypatch.delenv("QUOTAFLOW_DEPLOYMENTS_FILE", raising=False)
    get_settings.cache_clear()
    (tmp_path / "q.csv").write_text("id,q\nx1,two plus two\nx2,three plus three\n")
    (tmp_path / "ask.j2").write_text("Answer: {{ q }}")
    (tmp_path / "judge.j2").write_text("Was '{{ response_text }}' right for {{ q }}?")
    try:
        assert _run("run", "q.csv", "--template", "ask.j2", "--id-column", "id", "--quiet",
                    "--json", "-o", "first.parquet") == 0
        first = capsys.readouterr().out
        job_id = first.split('"id": "', 1)[1].split('"', 1)[0]
        assert _run("run", "--after", job_id, "--template", "judge.j2", "--model", "judge",
                    "--quiet", "-o", "judged.parquet") == 0
        rows = pq.read_table(tmp_path / "judged.parquet").to_pylist()
        assert [(r["id"], r["custom_id"], r["response_text"]) for r in rows] == [
            ("x1", "x1", "simulated reply to: Was 'simulated reply to: Answer: two plus two' "
                         "right for two plus two?"),
            ("x2", "x2", "simulated reply to: Was 'simulated reply to: Answer: three plus "
                         "three' right for three plus three?")]
        assert rows[0]["previous_response_text"] == "simulated reply to: Answer: two plus two"
        assert _run("run", "q.csv", "--after", job_id, "--template", "judge.j2") == 2
        assert "give INPUT_FILE or --after JOB, not both" in capsys.readouterr().err
    finally:
        get_settings.cache_clear()
