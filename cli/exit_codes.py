"""The CLI's exit statuses: what a script can tell from `$?` without parsing any text.

Documented in docs/operations/cli.md; tests/cluster/test_cli_scripting.py checks each.
Distinct numbers for what a script does differently: fix the input (2), look at the
job's error lines (3), try again later or fix QUOTAFLOW_API_URL (4), fix the settings
before a service can start (78, sysexits' EX_CONFIG). Anything else quotaflow refuses
(an unknown job, a bad key, a job in the wrong state) is 1.
"""

from typing import Any

from quotaflow.constants import FINAL_STATUSES
from quotaflow.errors import (
    ConfigError,
    InvalidRequest,
    QuotaflowError,
    ServiceUnavailable,
)

OK = 0
ERROR = 1
INVALID_INPUT = 2  # also click's status for a usage error: both mean "fix what you gave"
FAILED_LINES = 3
UNREACHABLE = 4
CONFIG = 78
ABORTED = 130

# Job statuses that end a job; `completed` with no failed line is the only success.
FINAL = FINAL_STATUSES


def for_error(exc: QuotaflowError) -> int:
    """The status a command that raised `exc` ends with."""
    if isinstance(exc, ConfigError):
        return CONFIG
    if isinstance(exc, ServiceUnavailable):
        return UNREACHABLE
    if isinstance(exc, InvalidRequest):
        return INVALID_INPUT
    return ERROR


def for_job(job: dict[str, Any]) -> int:
    """An ended job's status: 0 when it completed with every line answered, else 3 (some
    line failed or was invalid, or the job failed, expired or was cancelled)."""
    counts = job.get("request_counts") or {}
    if job.get("status") == "completed" and not counts.get("failed"):
        return OK
    return FAILED_LINES
