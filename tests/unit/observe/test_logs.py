"""Log lines as text or JSON, with the context execution passes (job id, batch, line,
deployment, attempt, status, latency), and output lines naming the provider's request id.
Unit tests: no server."""

import io
import json
import logging

import pytest

from quotaflow.config import Settings
from quotaflow.observe import logs
from quotaflow.results.output import render_stored


def test_a_line_without_a_provider_id_keeps_ours() -> None:
    ours = json.loads(render_stored("batch_req_1", "a", 200, "{}", None, None))
    theirs = json.loads(render_stored("batch_req_1", "a", 200, "{}", None, None, "req_x"))
    assert ours["response"]["request_id"] == "batch_req_1"
    assert (theirs["id"], theirs["response"]["request_id"]) == ("batch_req_1", "req_x")


CONTEXT = {"job_id": "batch_abc", "batch": "1-100", "line": 7, "custom_id": "r7",
           "deployment": "mock-http", "attempt": 2, "status": 200, "latency_ms": 12.5}


def _log_once(log_format: str) -> str:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.formatter(log_format))
    logger = logging.getLogger("quotaflow.test_provenance")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        logger.info("line %d answered", 7, extra=CONTEXT)
        logger.warning("no context here")
    finally:
        logger.removeHandler(handler)
    return stream.getvalue()


def test_json_log_lines_parse_and_carry_the_context() -> None:
    first, second = (json.loads(line) for line in _log_once("json").splitlines())
    assert first["message"] == "line 7 answered" and first["level"] == "INFO"
    assert {key: first[key] for key in CONTEXT} == CONTEXT
    assert second["message"] == "no context here" and "job_id" not in second


def test_text_log_lines_name_the_job() -> None:
    first, second = _log_once("text").splitlines()
    assert first.endswith("line 7 answered job_id=batch_abc batch=1-100 line=7 custom_id=r7 "
                          "deployment=mock-http attempt=2 status=200 latency_ms=12.5")
    assert second.endswith("no context here")


def test_log_format_is_a_setting(monkeypatch) -> None:
    monkeypatch.setenv("QUOTAFLOW_LOG_FORMAT", "json")
    assert Settings(_env_file=None).log_format == "json"
    monkeypatch.setenv("QUOTAFLOW_LOG_FORMAT", "xml")
    with pytest.raises(ValueError):
        Settings(_env_file=None)


def test_configure_installs_one_handler_of_its_own(monkeypatch) -> None:
    root = logging.getLogger()
    before = [h for h in root.handlers if h.get_name() != logs.HANDLER_NAME]
    level = root.level
    try:
        logs.configure(Settings(log_format="json", _env_file=None))
        logs.configure(Settings(log_format="json", _env_file=None), "warning")
        ours = [h for h in root.handlers if h.get_name() == logs.HANDLER_NAME]
        assert len(ours) == 1 and isinstance(ours[0].formatter, logs.JsonFormatter)
        assert [h for h in root.handlers if h not in ours] == before  # others' stay
        assert root.level == logging.WARNING
    finally:
        for handler in root.handlers[:]:
            if handler.get_name() == logs.HANDLER_NAME:
                root.removeHandler(handler)
        root.setLevel(level)
        logging.captureWarnings(False)


def test_a_failed_call_is_one_warning_line_with_the_providers_request_id() -> None:
    from types import SimpleNamespace

    from quotaflow.errors import RetryableProviderError
    from quotaflow.execution import attempts
    from quotaflow.providers.outcomes import Provenance

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.formatter("json"))
    attempts.log.addHandler(handler)
    run = SimpleNamespace(context={"job_id": "batch_abc", "batch": "1-100"})
    admitted = SimpleNamespace(item=SimpleNamespace(line_no=7, custom_id="r7"))
    error = RetryableProviderError("az: HTTP 429: slow down", status_code=429,
                                   request_id="apim-123")
    try:
        attempts._log_error(run, admitted, 2, error,  # type: ignore[arg-type]
                            Provenance("az", 2, 1.0, 1.0, 1.25), "retrying")
    finally:
        attempts.log.removeHandler(handler)
    line = json.loads(stream.getvalue())
    assert line["level"] == "WARNING" and line["message"] == (
        "line 7: az: HTTP 429: slow down (attempt 2, retrying)")
    assert (line["provider_request_id"], line["status"], line["deployment"], line["custom_id"],
            line["latency_ms"]) == ("apim-123", 429, "az", "r7", 250.0)
