"""The CLI's progress is the shared one (quotaflow_client/progress.py), which the Python
client's `job.wait(progress=True)` shows too."""

from quotaflow_client.progress import (
    LineProgress,
    NoProgress,
    RateColumn,
    bar_progress,
    eta_text,
    request_progress,
    stderr,
)

__all__ = ["LineProgress", "NoProgress", "RateColumn", "bar_progress", "eta_text",
           "request_progress", "stderr"]
