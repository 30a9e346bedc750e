"""Tables out (issue 50): a job's answers joined to its input rows in input order, with
text, parsed JSON, usage, finish reason and error columns, written as Parquet or CSV."""

import csv
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from quotaflow.errors import TableError
from quotaflow.tables import sources
from quotaflow.tables.answers import answer
from quotaflow.tables.join import joined_batches
from quotaflow.tables.sinks import TableSink
from quotaflow.tables.sources import open_table, rows_source


def chat_answer(custom_id: str, text: str, finish: str = "stop") -> dict:
    return {"id": "batch_req_1", "custom_id": custom_id, "error": None, "response": {
        "status_code": 200, "request_id": "r", "body": {
            "choices": [{"index": 0, "finish_reason": finish,
                         "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}}}}


def failed(custom_id: str | None, message: str, line: int) -> dict:
    return {"id": "batch_req_2", "custom_id": custom_id, "response": None,
            "error": {"code": "provider_error", "line": line, "message": message}}


def test_an_answer_has_its_text_json_usage_and_finish_reason() -> None:
    assert answer(chat_answer("a", ' {"label": "spam"} ')) == {
        "custom_id": "a", "response_text": ' {"label": "spam"} ',
        "response_json": '{"label":"spam"}', "prompt_tokens": 7, "completion_tokens": 3,
        "finish_reason": "stop", "error": None}
    assert answer(chat_answer("a", "plain {text"))["response_json"] is None
    assert answer(failed("b", "rate limited", 2))["error"] == "rate limited"
    http_error = {"custom_id": "c", "error": None, "response": {
        "status_code": 400, "body": {"error": {"message": "bad model"}}}}
    assert answer(http_error)["error"] == "bad model"
    assert answer(None) == dict.fromkeys(answer(None))  # no line yet: every column empty


def test_an_anthropic_result_line_is_read_too() -> None:
    line = {"custom_id": "a", "result": {"type": "succeeded", "message": {
        "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
        "usage": {"input_tokens": 4, "output_tokens": 1}}}}
    got = answer(line)
    assert (got["response_text"], got["prompt_tokens"], got["completion_tokens"],
            got["finish_reason"]) == ("hi", 4, 1, "end_turn")
    errored = {"custom_id": "b", "result": {"type": "errored", "error": {
        "type": "error", "error": {"type": "api_error", "message": "overloaded"}}}}
    assert answer(errored)["error"] == "overloaded"


def test_answers_join_their_rows_in_input_order() -> None:
    rows = [{"q": f"question {i}", "n": i} for i in range(1, 6)]
    results = [chat_answer("1", "one"), chat_answer("3", "three"), chat_answer("5", "five")]
    errors = [failed("2", "refused", 2)]  # row 4: no answer yet (a job still running)
    [batch] = joined_batches(rows_source(rows), None, results, errors)
    table = pa.Table.from_batches([batch]).to_pylist()
    assert [(r["q"], r["n"], r["custom_id"], r["response_text"], r["error"]) for r in table] == [
        ("question 1", 1, "1", "one", None), ("question 2", 2, "2", None, "refused"),
        ("question 3", 3, "3", "three", None), ("question 4", 4, "4", None, None),
        ("question 5", 5, "5", "five", None)]


def test_an_invalid_line_without_custom_id_joins_by_its_line() -> None:
    rows = [{"q": "a"}, {"q": "b"}]
    [batch] = joined_batches(rows_source(rows), None, [chat_answer("1", "x")],
                             [failed(None, "line 2: bad", 2)])
    assert batch.column("error").to_pylist() == [None, "line 2: bad"]


def test_the_id_column_joins_and_no_second_custom_id_is_added() -> None:
    rows = [{"custom_id": "k1", "q": "a"}, {"custom_id": "k2", "q": "b"}]
    [batch] = joined_batches(rows_source(rows), "custom_id",
                             [chat_answer("k1", "A"), chat_answer("k2", "B")], [])
    assert batch.schema.names.count("custom_id") == 1
    assert batch.column("response_text").to_pylist() == ["A", "B"]


def test_answers_for_another_table_are_refused_not_written_with_holes() -> None:
    with pytest.raises(TableError, match=r"custom_id 'zz' .* is it the table the job was made"):
        list(joined_batches(rows_source([{"q": "a"}]), None, [chat_answer("zz", "x")], []))
    with pytest.raises(TableError, match=r"columns named as the answer columns .*'error'"):
        list(joined_batches(rows_source([{"error": "mine"}]), None, [], []))


@pytest.mark.parametrize("suffix", ["parquet", "csv"])
def test_a_table_out_keeps_the_input_columns_batch_by_batch(
        tmp_path: Path, suffix: str, monkeypatch) -> None:
    monkeypatch.setattr(sources, "BATCH_ROWS", 4)
    source_path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"q": [f"q{i}" for i in range(10)], "n": list(range(10)),
                             "tags": [["x", "y"]] * 10}), source_path, row_group_size=4)
    answers = [chat_answer(str(i), f"a{i}") for i in range(1, 11)]
    out = tmp_path / f"out.{suffix}"
    with TableSink(out) as sink:
        for batch in joined_batches(open_table(source_path), None, answers, []):
            assert batch.num_rows <= 4  # one batch in memory at a time
            sink.write(batch)
    assert sink.rows == 10 and not (tmp_path / f"out.{suffix}.part").exists()
    if suffix == "parquet":
        table = pq.read_table(out)
        assert table.schema.field("n").type == pa.int64()
        assert table.column("tags").to_pylist()[0] == ["x", "y"]
        rows = table.to_pylist()
    else:
        with out.open(newline="") as handle:
            rows = list(csv.DictReader(handle))
        assert json.loads(rows[0]["tags"]) == ["x", "y"]  # nested as JSON text
    assert [(str(r["n"]), r["response_text"]) for r in rows] == [
        (str(i), f"a{i + 1}") for i in range(10)]


def test_a_join_that_fails_leaves_no_file(tmp_path: Path) -> None:
    out = tmp_path / "out.parquet"
    with pytest.raises(TableError), TableSink(out) as sink:
        for batch in joined_batches(rows_source([{"q": "a"}]), None,
                                    [chat_answer("1", "x"), chat_answer("9", "y")], []):
            sink.write(batch)
    assert list(tmp_path.iterdir()) == []
