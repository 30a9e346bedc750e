"""How many lines each of a job's batches holds: small ones first, larger ones later.

A batch message costs a worker a fixed amount of CPU beside its requests: receiving
and acknowledging it, its Celery events, its claim and its report, about as much as
25 instant requests (`python -m bench.e2e --batch-size N`, docs/benchmarks.md). At 100
lines a message that is a fifth of what a worker spends on a fast provider; at 800 it
is a thirtieth. But a batch run is also the unit of parallelism: each has its own
deployment's `max_concurrency` calls in flight, so a small job cut into few large
batches would run on few workers with few calls out.

So a job's batches start at QUOTAFLOW_BATCH_SIZE lines and double every GROW_EVERY
batches up to QUOTAFLOW_LARGEST_BATCH_SIZE: a job of up to GROW_EVERY small batches is
cut exactly as before, and a large job, which has batches enough for every worker at
any size, pays the message's cost on few of its requests. A batch that runs long on a
slow deployment hands its unsent lines back to the queue (execution/admission.py), so a
large batch does not hold a worker towards Celery's time limit.
"""

from collections.abc import Iterable, Iterator

from quotaflow.config import Settings
from quotaflow.dispatch.queues import BatchRef

# Batches of one size before the size doubles: as many as the workers of a mid-sized
# cluster run at once, so every worker has a batch of each size before it grows.
GROW_EVERY = 16


def batch_sizes(first: int, largest: int) -> Iterator[int]:
    """The size of each batch in turn, without end."""
    size = first
    while True:
        for _ in range(GROW_EVERY):
            yield size
        size = max(first, min(largest, size * 2))


def sizes_for(settings: Settings) -> Iterator[int]:
    """The configured sizes (a QUOTAFLOW_BATCH_SIZE above the largest does not grow)."""
    return batch_sizes(settings.batch_size, settings.largest_batch_size)


def cut(job_id: str, line_numbers: Iterable[int], sizes: Iterator[int]) -> list[BatchRef]:
    """Line numbers, in order, as consecutive batches of the given sizes."""
    batches: list[BatchRef] = []
    size, count, first, last = next(sizes), 0, 0, 0
    for line in line_numbers:
        if count == 0:
            first = line
        last = line
        count += 1
        if count == size:
            batches.append(BatchRef(job_id, first, last))
            size, count = next(sizes), 0
    if count:
        batches.append(BatchRef(job_id, first, last))
    return batches
