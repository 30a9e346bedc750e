"""Running batches: claim, admit, call, settle, store (executor.py is the way in)."""

from quotaflow.execution.attempts import LIMITER_DOWN_BACKOFF_S
from quotaflow.execution.batch import BatchReport
from quotaflow.execution.executor import BatchExecutor

__all__ = ["LIMITER_DOWN_BACKOFF_S", "BatchExecutor", "BatchReport"]
