"""`quotaflow submit` and `quotaflow run` of a table that cannot become requests: the
message names the row and the column, the exit status is 2, no traceback, and nothing
was sent (the API client is never asked) or stored (no database is made)."""

import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cli import exit_codes
from cli.client import ApiClient
from cli.main import main
from quotaflow.config import get_settings
from quotaflow_client.uploads import Counted, count_lines


@pytest.fixture
def table(tmp_path: Path) -> Path:
    path = tmp_path / "data.parquet"
    pq.write_table(pa.table({"id": ["a", "b", ""], "text": ["x", "y", "z"]}), path)
    (tmp_path / "prompt.j2").write_text("Summarize: {{ text }}")
    return path


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[tuple]:
    """What reached the API client; its URL is one nothing listens on."""
    calls: list[tuple] = []
    monkeypatch.setattr(ApiClient, "create_job",
                        lambda self, *args, **kwargs: calls.append((args, kwargs)) or {"id": "j"})
    monkeypatch.setenv("QUOTAFLOW_API_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("QUOTAFLOW_DATABASE_URL", f"sqlite:///{tmp_path / 'embedded.db'}")
    get_settings.cache_clear()
    yield calls
    get_settings.cache_clear()


def invoke(*args: str) -> int:
    """The command as `quotaflow` runs it (cli.main.main: quotaflow's errors as messages
    on stderr, usage errors too); its exit status."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", ["quotaflow", *args])
        try:
            main()
        except SystemExit as ended:
            return int(ended.code or 0)
    return 0


@pytest.mark.parametrize("command", ["submit", "run"])
@pytest.mark.parametrize(("template", "options", "said"), [
    ("Summarize: {{ txt }}", [], "row 1, column 'txt': prompt.j2 uses 'txt', which the row "
                                 "does not have (its columns: 'id', 'text')"),
    ("Summarize: {% if text %}", [], "prompt.j2, line 1: "),
    ("{{ text }}", ["--id-column", "key"], "data.parquet has no column 'key' to take ids "
                                           "from (its columns: 'id', 'text')"),
    ("{{ text }}", ["--id-column", "id"], "row 3, column 'id': has no value in the id column"),
], ids=["missing-column", "syntax-error", "no-id-column", "empty-id"])
def test_a_row_that_fails_names_itself_and_nothing_is_sent(
        table: Path, sent: list, capsys: pytest.CaptureFixture[str], command: str,
        template: str, options: list[str], said: str) -> None:
    (table.parent / "prompt.j2").write_text(template)
    code = invoke(command, str(table), "--template", str(table.parent / "prompt.j2"), *options)
    err = capsys.readouterr().err
    assert code == exit_codes.INVALID_INPUT, err
    assert said in err and "Traceback" not in err
    assert sent == []  # submit: the API was never asked
    assert not (table.parent / "embedded.db").exists()  # run: no job stored


@pytest.mark.parametrize("command", ["submit", "run"])
def test_an_unreadable_parquet_file_is_named(table: Path, sent: list, command: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    table.write_bytes(b"PAR1 this is not a parquet file")
    code = invoke(command, str(table), "--template", str(table.parent / "prompt.j2"))
    err = capsys.readouterr().err
    assert code == exit_codes.INVALID_INPUT
    assert "error: cannot read data.parquet as Parquet" in err and "Traceback" not in err
    assert sent == [] and not (table.parent / "embedded.db").exists()


def test_a_table_without_a_template_is_a_usage_error(
        table: Path, sent: list, capsys: pytest.CaptureFixture[str]) -> None:
    assert invoke("submit", str(table)) == exit_codes.INVALID_INPUT
    assert "data.parquet is a table: give --template PROMPT.j2" in capsys.readouterr().err
    jsonl = table.with_suffix(".jsonl")
    jsonl.write_text("{}\n")
    assert invoke("submit", str(jsonl), "--model", "m") == exit_codes.INVALID_INPUT
    assert "--model shape a table's rows: give --template too" in capsys.readouterr().err
    assert sent == []


def test_a_good_table_is_sent_as_requests_with_where_it_came_from(
        table: Path, sent: list, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    pq.write_table(pa.table({"id": ["a", "b"], "text": ["x", "y"]}), table)
    bodies: list[bytes] = []

    def create_job(self, path: Path, *args, **kwargs) -> dict:
        bodies.append(path.read_bytes())
        sent.append((args, kwargs))
        return {"id": "batch_1"}

    monkeypatch.setattr(ApiClient, "create_job", create_job)
    code = invoke("submit", str(table), "--template", str(tmp_path / "prompt.j2"),
                  "--id-column", "id", "--model", "m", "--metadata", '{"team": "t"}')
    assert (code, capsys.readouterr().out.strip()) == (0, "batch_1")
    [(args, kwargs)] = sent
    assert kwargs["filename"] == "data.parquet"
    assert '"quotaflow_input": "' + str(table.resolve()) + '"' in args[1]
    assert '"team": "t"' in args[1] and '"quotaflow_id_column": "id"' in args[1]
    assert bodies[0].count(b"\n") == 2 and b'"custom_id":"a"' in bodies[0]


def test_an_upload_tells_the_lines_it_has_sent(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"prompt": "a"}\n' * 50_000)
    seen: list[int] = []
    with path.open("rb") as handle:
        sent = b"".join(Counted(handle, seen.append))
    assert sent == path.read_bytes() and seen[0] == 0 and seen[-1] == 50_000
    assert seen == sorted(seen) and len(seen) > 2  # piece by piece, not once at the end
    assert count_lines(path) == 50_000
