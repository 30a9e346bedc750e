"""A stage's rows: the previous job's rows with its answers, failed ones left out unless
asked for, custom_id carried over into the next job's requests."""

from typing import Any

import orjson
import pytest

from quotaflow.errors import JobStateError
from quotaflow.tables.requests import RequestShape, request_lines
from quotaflow.tables.sources import MemoryRows
from quotaflow.tables.stages import (
    STAGE_ID_COLUMN,
    PreviousAnswers,
    StageRows,
    job_rows,
    stage_rows,
)
from quotaflow.tables.templates import PromptTemplate


def _ok(custom_id: str, text: str) -> dict[str, Any]:
    return {"custom_id": custom_id, "error": None, "response": {"status_code": 200, "body": {
        "choices": [{"finish_reason": "stop", "message": {"content": text}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2}}}}


def _failed(custom_id: str) -> dict[str, Any]:
    return {"custom_id": custom_id, "response": None,
            "error": {"code": "provider_error", "message": "upstream 500"}}


LINES = {False: [_ok("a", "Paris"), _ok("c", '{"city": "Lima"}')], True: [_failed("b")]}


def fetch_lines(job_id: str, errors: bool) -> list[dict[str, Any]]:
    assert job_id == "batch_1"
    return LINES[errors]


def _table() -> MemoryRows:
    return MemoryRows([{"key": "a", "q": "capital of France"},
                       {"key": "b", "q": "capital of Peru"},
                       {"key": "c", "q": "a city as JSON"}])


def test_a_table_jobs_rows_with_their_answers_failed_ones_left_out() -> None:
    rows = [row for batch in StageRows("batch_1", _table(), "key", fetch_lines).row_batches()
            for row in batch]
    assert [(r["key"], r["q"], r["custom_id"], r["response_text"]) for r in rows] == [
        ("a", "capital of France", "a", "Paris"), ("c", "a city as JSON", "c",
                                                   '{"city": "Lima"}')]
    assert rows[1]["response_json"] == '{"city":"Lima"}' and rows[0]["completion_tokens"] == 2
    assert rows[0]["finish_reason"] == "stop" and rows[0]["error"] is None


def test_include_failed_keeps_them_in_input_order() -> None:
    source = StageRows("batch_1", _table(), "key", fetch_lines, include_failed=True)
    rows = [row for batch in source.row_batches() for row in batch]
    assert [(r["custom_id"], r["error"]) for r in rows] == [
        ("a", None), ("b", "upstream 500"), ("c", None)]
    assert source.columns() == ["key", "q", "custom_id", "response_text", "response_json",
                                "prompt_tokens", "completion_tokens", "finish_reason", "error"]


def test_a_job_of_requests_gives_its_answers_alone() -> None:
    rows = [row for batch in StageRows("batch_1", None, None, fetch_lines,
                                       include_failed=True).row_batches() for row in batch]
    assert [(r["custom_id"], r["response_text"]) for r in rows] == [
        ("a", "Paris"), ("c", '{"city": "Lima"}'), ("b", None)]


def test_the_next_requests_carry_the_custom_id_and_the_answer() -> None:
    source = StageRows("batch_1", _table(), "key", fetch_lines)
    template = PromptTemplate("Is {{ response_text }} right for {{ q }}?")
    lines = [orjson.loads(line) for line in request_lines(
        source, template, RequestShape(model="judge", id_column=STAGE_ID_COLUMN))]
    assert [(line["custom_id"], line["body"]["messages"][-1]["content"]) for line in lines] == [
        ("a", "Is Paris right for capital of France?"),
        ("c", 'Is {"city": "Lima"} right for a city as JSON?')]


def test_a_running_job_is_refused_and_a_stage_of_a_stage_walks_back() -> None:
    running = {"id": "batch_1", "status": "in_progress", "metadata": {}}
    with pytest.raises(JobStateError, match="job batch_1 is in_progress: a stage after it"):
        stage_rows(running, lambda job_id: running, fetch_lines)
    first = {"id": "batch_1", "status": "completed", "metadata": {}}
    second = {"id": "batch_2", "status": "completed",
              "metadata": {"quotaflow_after": "batch_1", "quotaflow_id_column": "custom_id"}}
    found = job_rows(second, {"batch_1": first}.__getitem__, fetch_lines)
    # the rows the second job's answers are joined to: the first's answers as previous_*
    assert isinstance(found, PreviousAnswers) and found.rows.job_id == "batch_1"
    rows = [r for b in found.row_batches() for r in b]
    assert [(r["custom_id"], r["previous_response_text"]) for r in rows] == [
        ("a", "Paris"), ("c", '{"city": "Lima"}')]
    assert "response_text" not in found.columns()
