"""Tables in (issue 50): CSV, Parquet and JSONL rows made into OpenAI Batch lines through
a sandboxed, strict prompt template, read a batch at a time; and a row that cannot
become a request named by its row and column."""

import importlib
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from quotaflow.errors import InvalidRequest, RowError, TableError, TemplateError
from quotaflow.tables import sources
from quotaflow.tables.requests import (
    RequestShape,
    request_lines,
    requests_file,
    response_format,
)
from quotaflow.tables.sources import open_table, rows_source
from quotaflow.tables.templates import PromptTemplate

ROWS = [{"id": "a", "text": "hello", "n": 1}, {"id": "b", "text": "world", "n": 2}]


def lines_of(source: sources.RowSource, template: str, **shape: object) -> list[dict]:
    return [json.loads(line) for line in
            request_lines(source, PromptTemplate(template), RequestShape(**shape))]


def parquet(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.mark.parametrize("kind", ["parquet", "csv", "jsonl"])
def test_each_format_gives_one_chat_line_per_row_in_order(tmp_path: Path, kind: str) -> None:
    path = tmp_path / f"data.{kind}"
    if kind == "parquet":
        parquet(path, ROWS)
    elif kind == "csv":
        path.write_text("id,text,n\na,hello,1\nb,world,2\n")
    else:
        path.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    lines = lines_of(open_table(path), "Say {{ text }} #{{ n }}", model="m", max_tokens=20,
                     system="Be brief.")
    assert [line["custom_id"] for line in lines] == ["1", "2"]  # the row's number
    assert lines[0] == {"custom_id": "1", "method": "POST", "url": "/v1/chat/completions",
                        "body": {"model": "m", "max_tokens": 20, "messages": [
                            {"role": "system", "content": "Be brief."},
                            {"role": "user", "content": "Say hello #1"}]}}
    assert lines[1]["body"]["messages"][1]["content"] == "Say world #2"


def test_the_id_column_names_each_line_and_csv_keeps_text_as_written(tmp_path: Path) -> None:
    path = tmp_path / "zips.csv"
    path.write_text("zip,city\n01234,Nowhere\n\n98765,Elsewhere\n\n")  # blank: no row
    lines = lines_of(open_table(path), "{{ city }} {{ zip }}", id_column="zip")
    assert [(line["custom_id"], line["body"]["messages"][0]["content"]) for line in lines] == [
        ("01234", "Nowhere 01234"), ("98765", "Elsewhere 98765")]
    assert "model" not in lines[0]["body"]  # the route's default model, as a shorthand line


def test_a_missing_column_names_the_row_and_the_column() -> None:
    rows = [{"text": "ok"}, {"text": "ok", "other": 1}, {"summary": "no text"}]
    with pytest.raises(RowError) as caught:
        lines_of(rows_source(rows), "{{ text }}")
    assert (caught.value.row, caught.value.column) == (3, "text")
    assert str(caught.value).startswith("row 3, column 'text': ")
    assert "'summary'" in str(caught.value)  # the columns the row has


def test_a_template_syntax_error_is_refused_before_any_row() -> None:
    with pytest.raises(TemplateError, match=r"prompt\.j2, line 2: .*"):
        PromptTemplate("Hello\n{% if text %}", "prompt.j2")


def test_the_template_runs_sandboxed() -> None:
    with pytest.raises(RowError, match=r"row 1: .*sandbox forbids"):
        lines_of(rows_source(ROWS), "{{ text.__class__.__mro__[1].__subclasses__() }}")


def test_nulls_render_as_nothing_and_row_reaches_odd_column_names() -> None:
    rows = [{"first name": "Ada", "note": None}]
    [line] = lines_of(rows_source(rows), 'Hi {{ row["first name"] }}{{ note }}!')
    assert line["body"]["messages"][0]["content"] == "Hi Ada!"


def test_an_empty_prompt_is_an_error_not_a_request() -> None:
    with pytest.raises(RowError, match=r"row 2: .*empty prompt"):
        lines_of(rows_source([{"t": "x"}, {"t": " "}]), "{{ t }}")


def test_a_bad_id_column_is_named(tmp_path: Path) -> None:
    with pytest.raises(TableError, match=r"no column 'key' to take ids from .*'id', 'text'"):
        lines_of(rows_source(ROWS), "{{ text }}", id_column="key")
    with pytest.raises(RowError) as caught:
        lines_of(rows_source([{"id": "a"}, {"id": ""}]), "{{ id }}", id_column="id")
    assert (caught.value.row, caught.value.column) == (2, "id")


def test_an_unreadable_parquet_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "broken.parquet"
    path.write_bytes(b"PAR1 not really parquet")
    with pytest.raises(TableError, match=r"cannot read broken\.parquet as Parquet"):
        lines_of(open_table(path), "{{ x }}")
    with pytest.raises(TableError, match="not a table quotaflow reads"):
        open_table(tmp_path / "data.xlsx")


def test_a_csv_row_with_the_wrong_field_count_is_named(tmp_path: Path) -> None:
    path = tmp_path / "ragged.csv"
    path.write_text("a,b\n1,2\n3\n")
    with pytest.raises(RowError, match=r"row 2: has 1 fields where ragged\.csv's header has 2"):
        lines_of(open_table(path), "{{ a }}")


def test_a_failing_row_leaves_no_requests_file(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    rows = [{"text": "ok"}] * 10 + [{"txt": "typo"}]
    with pytest.raises(RowError, match="row 11, column 'text'"), requests_file(
            rows_source(rows), PromptTemplate("{{ text }}"), RequestShape()):
        pytest.fail("a failing table must never be handed on to be sent")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind", ["parquet", "csv", "jsonl"])
def test_tables_are_read_a_batch_at_a_time(tmp_path: Path, kind: str, monkeypatch) -> None:
    monkeypatch.setattr(sources, "BATCH_ROWS", 3)
    rows = [{"k": str(i)} for i in range(10)]
    path = tmp_path / f"t.{kind}"
    if kind == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=3)
    elif kind == "csv":
        path.write_text("k\n" + "".join(f"{i}\n" for i in range(10)))
    else:
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    source = open_table(path)
    assert [len(batch) for batch in source.row_batches()] == [3, 3, 3, 1]
    assert [batch.num_rows for batch in source.arrow_batches()] == [3, 3, 3, 1]
    lines = lines_of(source, "{{ k }}")
    assert [line["body"]["messages"][0]["content"] for line in lines] == [str(i) for i in
                                                                           range(10)]


def test_response_format_from_a_bare_schema_or_openais_own_form() -> None:
    schema = {"type": "object", "properties": {"label": {"type": "string"}}}
    assert response_format(schema, "label schema") == {
        "type": "json_schema", "json_schema": {"name": "label_schema", "schema": schema}}
    named = {"name": "x", "schema": schema, "strict": True}
    assert response_format(named) == {"type": "json_schema", "json_schema": named}
    assert response_format({"type": "json_object"}) == {"type": "json_object"}
    [line] = lines_of(rows_source([{"t": "x"}]), "{{ t }}",
                      response_format=response_format(schema))
    assert line["body"]["response_format"]["json_schema"]["schema"] == schema


def test_an_arrow_table_is_rows_too() -> None:
    table = pa.Table.from_pylist(ROWS)
    assert [line["custom_id"] for line in lines_of(rows_source(table), "{{ text }}",
                                                   id_column="id")] == ["a", "b"]


@pytest.mark.parametrize("library", ["pandas", "polars"])
def test_a_dataframe_is_rows_too(library: str) -> None:
    frames = importlib.import_module(library)  # the dev extra has both; quotaflow neither
    frame = frames.DataFrame(ROWS)
    assert [line["body"]["messages"][0]["content"]
            for line in lines_of(rows_source(frame), "{{ text }} {{ n }}")] == [
        "hello 1", "world 2"]


def test_table_errors_are_invalid_requests() -> None:
    # the CLI's exit status 2 and the API's 400 both come from InvalidRequest
    assert issubclass(RowError, InvalidRequest) and issubclass(TemplateError, InvalidRequest)
    with pytest.raises(TableError, match="rows must be a list of dicts"):
        rows_source(42)
