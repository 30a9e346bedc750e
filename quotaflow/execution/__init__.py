"""Running batches: claim, admit, call, settle, store (executor.py is the way in)."""

from quotaflow.execution.batch import BatchReport
from quotaflow.execution.executor import BatchExecutor
from quotaflow.execution.timing import LIMITER_DOWN_BACKOFF_S

__all__ = ["LIMITER_DOWN_BACKOFF_S", "BatchExecutor", "BatchReport"]
