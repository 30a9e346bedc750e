"""Logging for every process (worker, API, CLI), configured in one place.

`QUOTAFLOW_LOG_FORMAT=json` writes one JSON object per line (python-json-logger), so a
log pipeline can filter a job's lines without parsing prose; the plain-text default
appends the same context as `key=value` after the message. The context is what the
execution log calls pass as `extra=`: the job id, batch, line, custom_id, deployment,
attempt, status, latency and the provider's request id.
"""

import logging
import sys
from typing import Any

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter

# The `extra=` keys quotaflow's log calls use; the text format shows those present.
CONTEXT = ("job_id", "batch", "line", "custom_id", "deployment", "attempt", "status",
           "latency_ms", "provider_request_id", "claimed", "succeeded", "failed", "retry_in")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
HANDLER_NAME = "quotaflow"
JSON_FIELDS = "%(asctime)s %(levelname)s %(name)s %(message)s"


class ContextFormatter(logging.Formatter):
    """Plain text with the record's context after the message: `... job_id=batch_x`."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        context = " ".join(f"{key}={value}" for key in CONTEXT
                           if (value := getattr(record, key, None)) is not None)
        return f"{text} {context}" if context else text


def formatter(log_format: str) -> logging.Formatter:
    if log_format == "json":
        # uvicorn's extra `color_message` is its message again, with terminal colours.
        return JsonFormatter(JSON_FIELDS, rename_fields={"levelname": "level", "name": "logger"},
                             reserved_attrs=[*RESERVED_ATTRS, "color_message"])
    return ContextFormatter(TEXT_FORMAT)


def configure(settings: Any, level: int | str = logging.INFO) -> None:
    """Send the root logger's records to stderr in the settings' format. A second call
    replaces the handler the first installed and leaves others' handlers alone."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(settings.log_format))
    handler.set_name(HANDLER_NAME)
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == HANDLER_NAME]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    logging.captureWarnings(True)  # Python's warnings become log lines in the same format
    # One line per provider request drowns the log; failures are logged by quotaflow.
    logging.getLogger("httpx").setLevel(logging.WARNING)
