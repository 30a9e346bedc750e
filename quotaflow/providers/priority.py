"""Which queue the request being sent came from, for providers that schedule by it.

The provider interface is `send(url, body)`: a queue is not part of a request's body,
and adding it to every provider's signature would touch all of them for the one
that uses it. The executor sets the batch's queue in a context variable when the
batch starts; every task the run creates copies it, so a local engine reads the
queue of the very call it is serving, whichever batch (and job) it came from.
"""

from contextvars import ContextVar

from quotaflow.constants import DEFAULT_QUEUE, QUEUE_BULK, QUEUE_REALTIME, QUEUE_STANDARD

current_queue: ContextVar[str] = ContextVar("quotaflow_current_queue", default=DEFAULT_QUEUE)

# vLLM's priority scheduler serves the lowest value first (ties: the earliest arrival).
ENGINE_PRIORITY = {QUEUE_REALTIME: 0, QUEUE_STANDARD: 1, QUEUE_BULK: 2}


def engine_priority(queue: str | None = None) -> int:
    """The engine priority of a queue (the current call's when not given)."""
    return ENGINE_PRIORITY.get(queue or current_queue.get(), ENGINE_PRIORITY[DEFAULT_QUEUE])
