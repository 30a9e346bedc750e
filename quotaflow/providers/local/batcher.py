"""Dynamic batching: requests that arrive one at a time leave as model batches.

The executor sends a local deployment's requests one by one, concurrently
(up to max_concurrency per batch run, from every run in the process); a GPU
is only busy enough when it gets them many at a time. The batcher owns one
thread that runs the model. A batch starts as soon as it is full (by rows or
by padded tokens) or its oldest request has waited max_wait. Requests of one
kind (generation or embedding) are ranked by prompt length and a batch takes
the most urgent request with its nearest neighbours in that ranking, so rows
pad little. Urgency is the request's queue (providers/priority.py: realtime,
standard, bulk; the oldest first among equals): a realtime request enters the
next batch ahead of bulk requests already waiting, as vLLM's priority
scheduler does for engine = "vllm", and a batch fills from its anchor's queue
before the ones after it; within a queue, nobody waits for ever. Torch-free,
so it is tested on its own.
"""

import logging
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

RunBatch = Callable[[Hashable, list[Any]], Sequence[Any]]


@dataclass
class Waiting:
    """One request in the queue: its sizes, its payload for the engine, its answer."""

    kind: Hashable
    prompt_tokens: int
    max_new_tokens: int
    payload: Any
    arrived: float
    priority: int = 1  # the engine priority of its queue: 0 realtime, 1 standard, 2 bulk
    future: Future[Any] = field(default_factory=Future)


def padded_tokens(batch: Sequence[Waiting]) -> int:
    """What a left-padded batch holds at its longest: rows x (longest prompt + longest reply)."""
    if not batch:
        return 0
    return len(batch) * (max(w.prompt_tokens for w in batch)
                         + max(w.max_new_tokens for w in batch))


def pick_batch(waiting: list[Waiting], max_size: int, max_tokens: int) -> list[Waiting]:
    """The most urgent request (lowest priority, then oldest) and its nearest neighbours
    by prompt length, within both bounds: first of its own priority, then, while room is
    left, of the priorities after it. Ranked by prompt length.

    A request too large for max_tokens on its own still runs, alone.
    """
    anchor = min(waiting, key=lambda w: (w.priority, w.arrived))
    same_kind = [w for w in waiting if w.kind == anchor.kind]
    batch = _neighbours(anchor, [w for w in same_kind if w.priority == anchor.priority],
                        max_size, max_tokens)
    later = sorted((w for w in same_kind if w.priority > anchor.priority),
                   key=lambda w: (w.priority, abs(w.prompt_tokens - anchor.prompt_tokens),
                                  w.arrived))
    for candidate in later:
        if len(batch) >= max_size:
            break
        if padded_tokens([*batch, candidate]) <= max_tokens:
            batch.append(candidate)
    return sorted(batch, key=lambda w: (w.prompt_tokens, w.arrived))


def _neighbours(oldest: Waiting, waiting: list[Waiting], max_size: int,
                max_tokens: int) -> list[Waiting]:
    """`oldest` and its nearest neighbours by prompt length among `waiting` (its kind and
    priority), growing towards the closer length while both bounds hold."""
    ranked = sorted(waiting, key=lambda w: (w.prompt_tokens, w.arrived))
    low = high = next(i for i, w in enumerate(ranked) if w is oldest)
    while high - low + 1 < max_size:
        below = ranked[low - 1] if low > 0 else None
        above = ranked[high + 1] if high + 1 < len(ranked) else None
        if below is None and above is None:
            break
        # Grow towards the neighbour whose length is closer: the least padding.
        grow_down = above is None or (below is not None and oldest.prompt_tokens
                                      - below.prompt_tokens <= above.prompt_tokens
                                      - oldest.prompt_tokens)
        candidate = below if grow_down else above
        assert candidate is not None  # both are None only when the loop broke above
        if padded_tokens([*ranked[low:high + 1], candidate]) > max_tokens:
            break
        if grow_down:
            low -= 1
        else:
            high += 1
    return ranked[low:high + 1]


class DynamicBatcher:
    """Gathers submitted requests into batches for `run_batch`, on a thread of its own.

    `run_batch(kind, payloads)` returns one answer per payload, in order; an
    exception it raises becomes every request's exception.
    """

    def __init__(self, run_batch: RunBatch, max_batch_size: int, max_batch_tokens: int,
                 max_wait_s: float, name: str = "quotaflow-batcher") -> None:
        self._run_batch = run_batch
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        self.max_wait_s = max_wait_s
        self._waiting: list[Waiting] = []
        self._changed = threading.Condition()
        self._closed = False
        # Sizes of the batches run so far: what tests and the benchmark look at.
        self.batch_sizes: list[int] = []
        self.name = name
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, kind: Hashable, prompt_tokens: int, max_new_tokens: int,
               payload: Any, priority: int = 1) -> Future[Any]:
        """Queue one request; its answer (or exception) arrives on the returned future.
        `priority` is its queue's engine priority (providers/priority.py)."""
        entry = Waiting(kind, prompt_tokens, max_new_tokens, payload, time.monotonic(),
                        priority)
        with self._changed:
            if self._closed:
                raise RuntimeError("the batcher is closed")
            self._waiting.append(entry)
            self._changed.notify()
        return entry.future

    def close(self, timeout_s: float = 60.0) -> None:
        """Stop after the batch in hand (waiting for it up to `timeout_s`); requests still
        waiting are cancelled."""
        with self._changed:
            self._closed = True
            self._changed.notify()
        self._thread.join(timeout=timeout_s)
        for entry in self._waiting:
            entry.future.cancel()

    def _ready(self) -> bool:
        """A batch should start now: it is full, or its oldest request waited long enough."""
        if len(self._waiting) >= self.max_batch_size:
            return True
        if padded_tokens(self._waiting) >= self.max_batch_tokens:
            return True
        oldest = min(w.arrived for w in self._waiting)
        return time.monotonic() - oldest >= self.max_wait_s

    def _next_batch(self) -> list[Waiting] | None:
        with self._changed:
            while True:
                # A request whose caller gave up (timed out) is not run.
                self._waiting = [w for w in self._waiting if not w.future.cancelled()]
                if self._closed:
                    return None
                if self._waiting and self._ready():
                    batch = pick_batch(self._waiting, self.max_batch_size,
                                       self.max_batch_tokens)
                    taken = {id(w) for w in batch}
                    self._waiting = [w for w in self._waiting if id(w) not in taken]
                    return batch
                if self._waiting:
                    oldest = min(w.arrived for w in self._waiting)
                    self._changed.wait(max(0.0, oldest + self.max_wait_s - time.monotonic()))
                else:
                    self._changed.wait()

    def _loop(self) -> None:
        while (batch := self._next_batch()) is not None:
            batch = [w for w in batch if w.future.set_running_or_notify_cancel()]
            if not batch:
                continue
            self.batch_sizes.append(len(batch))
            started = time.monotonic()
            try:
                answers = self._run_batch(batch[0].kind, [w.payload for w in batch])
                if len(answers) != len(batch):
                    raise RuntimeError(f"{self.name}: {len(answers)} answers for a batch "
                                       f"of {len(batch)}")
            except BaseException as exc:  # every caller must hear of it, whatever it is
                for entry in batch:
                    entry.future.set_exception(exc)
                continue
            log.info("%s: batch of %d %s requests (%d padded tokens) in %.0f ms", self.name,
                     len(batch), batch[0].kind, padded_tokens(batch),
                     (time.monotonic() - started) * 1000)
            for entry, answer in zip(batch, answers, strict=True):
                entry.future.set_result(answer)
