"""The dynamic batcher: batches bounded by rows and padded tokens, ranked by prompt length,
started by a full batch or by max_wait, and every caller answered (or told why not)."""

import threading
import time
from collections.abc import Hashable
from typing import Any

import pytest

from quotaflow.providers.local.batcher import DynamicBatcher, Waiting, padded_tokens, pick_batch


def waiting(prompt_tokens: int, arrived: float, max_new: int = 10, kind: str = "g",
            priority: int = 1) -> Waiting:
    return Waiting(kind, prompt_tokens, max_new, payload=prompt_tokens, arrived=arrived,
                   priority=priority)


class Recorder:
    """A stand-in model: records each batch and answers every payload with itself doubled."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.batches: list[tuple[Hashable, list[Any]]] = []
        self.delay_s = delay_s
        self.lock = threading.Lock()

    def __call__(self, kind: Hashable, payloads: list[Any]) -> list[Any]:
        with self.lock:
            self.batches.append((kind, list(payloads)))
        time.sleep(self.delay_s)
        return [p * 2 for p in payloads]


def test_a_batch_takes_the_oldest_and_its_nearest_neighbours_by_length() -> None:
    # Given requests of many prompt lengths, the oldest of length 50
    queue = [waiting(50, 0.0), *(waiting(n, 1.0 + n) for n in (5, 10, 48, 52, 55, 90, 200))]
    # When a batch of four is picked
    batch = pick_batch(queue, max_size=4, max_tokens=10_000)
    # Then it holds the oldest and the three lengths closest to it, ranked by length
    assert [w.prompt_tokens for w in batch] == [48, 50, 52, 55]


def test_a_batch_stays_within_its_padded_token_bound() -> None:
    queue = [waiting(n, float(i)) for i, n in enumerate([20, 22, 24, 26, 28, 30])]
    # rows x (longest prompt + max_new): 3 x (24 + 10) = 102 fits 110, a fourth would not
    batch = pick_batch(queue, max_size=16, max_tokens=110)
    assert [w.prompt_tokens for w in batch] == [20, 22, 24]
    assert padded_tokens(batch) <= 110


def test_a_request_larger_than_the_token_bound_runs_alone() -> None:
    queue = [waiting(500, 0.0), waiting(10, 1.0)]
    assert [w.prompt_tokens for w in pick_batch(queue, 16, 100)] == [500]


def test_kinds_are_never_mixed_in_one_batch() -> None:
    queue = [waiting(10, 0.0, kind="embed"), waiting(10, 1.0, kind="g"), waiting(11, 2.0,
                                                                                kind="embed")]
    assert {w.kind for w in pick_batch(queue, 16, 10_000)} == {"embed"}


def test_concurrent_requests_are_run_in_full_batches_and_each_gets_its_answer() -> None:
    # Given a batcher of 8 rows and a long max_wait, so only full batches start
    model = Recorder()
    batcher = DynamicBatcher(model, max_batch_size=8, max_batch_tokens=100_000, max_wait_s=5.0)
    try:
        # When 32 requests arrive at once
        futures = [batcher.submit("g", 10 + n, 5, n) for n in range(32)]
        answers = [f.result(timeout=10) for f in futures]
    finally:
        batcher.close()
    # Then they ran as four batches of eight and every caller got its own answer
    assert sorted(len(payloads) for _, payloads in model.batches) == [8, 8, 8, 8]
    assert answers == [2 * n for n in range(32)]


def test_a_lone_request_waits_max_wait_then_runs() -> None:
    model = Recorder()
    batcher = DynamicBatcher(model, max_batch_size=16, max_batch_tokens=100_000,
                             max_wait_s=0.3)
    try:
        started = time.monotonic()
        assert batcher.submit("g", 10, 5, 21).result(timeout=5) == 42
        waited = time.monotonic() - started
    finally:
        batcher.close()
    assert 0.25 <= waited < 3.0
    assert model.batches == [("g", [21])]


def test_requests_arriving_while_the_model_runs_form_the_next_batch() -> None:
    # Given a slow model (0.3 s a batch) and no waiting
    model = Recorder(delay_s=0.3)
    batcher = DynamicBatcher(model, max_batch_size=16, max_batch_tokens=100_000, max_wait_s=0)
    try:
        first = batcher.submit("g", 10, 5, 0)
        time.sleep(0.1)  # the first batch (of one) is running now
        rest = [batcher.submit("g", 10, 5, n) for n in range(1, 11)]
        for future in [first, *rest]:
            future.result(timeout=5)
    finally:
        batcher.close()
    # Then the ten that queued behind it ran together
    assert [len(p) for _, p in model.batches] == [1, 10]


def test_a_failing_batch_fails_each_of_its_requests_and_the_batcher_goes_on() -> None:
    calls = []

    def flaky(kind: Hashable, payloads: list[Any]) -> list[Any]:
        calls.append(payloads)
        if len(calls) == 1:
            raise RuntimeError("device fell over")
        return payloads

    batcher = DynamicBatcher(flaky, max_batch_size=4, max_batch_tokens=100_000, max_wait_s=0.05)
    try:
        failed = [batcher.submit("g", 10, 5, n) for n in range(4)]
        for future in failed:
            with pytest.raises(RuntimeError, match="device fell over"):
                future.result(timeout=5)
        assert batcher.submit("g", 10, 5, 7).result(timeout=5) == 7
    finally:
        batcher.close()


def test_a_request_whose_caller_gave_up_is_not_run() -> None:
    model = Recorder(delay_s=0.3)
    batcher = DynamicBatcher(model, max_batch_size=1, max_batch_tokens=100_000, max_wait_s=0)
    try:
        running = batcher.submit("g", 10, 5, 1)
        time.sleep(0.1)
        abandoned = batcher.submit("g", 10, 5, 2)
        assert abandoned.cancel()
        assert running.result(timeout=5) == 2
        assert batcher.submit("g", 10, 5, 3).result(timeout=5) == 6
    finally:
        batcher.close()
    assert [p for _, p in model.batches] == [[1], [3]]


REALTIME, BULK = 0, 2  # providers/priority.py's engine priorities


def test_a_realtime_request_anchors_the_batch_ahead_of_older_bulk_ones() -> None:
    # Given bulk requests waiting since long, and a realtime one just arrived, far from
    # them by length
    queue = [waiting(n, float(i), priority=BULK) for i, n in enumerate(range(10, 18))]
    queue.append(waiting(500, 100.0, priority=REALTIME))
    # When a batch of four is picked
    batch = pick_batch(queue, max_size=4, max_tokens=100_000)
    # Then the realtime request is in it, and the room left goes to the bulk requests
    # nearest its length
    assert [(w.prompt_tokens, w.priority) for w in batch] == [
        (15, BULK), (16, BULK), (17, BULK), (500, REALTIME)]


def test_a_batch_fills_from_the_urgent_queue_before_the_next() -> None:
    queue = [waiting(20, 0.0, priority=BULK), waiting(21, 1.0, priority=1),
             *(waiting(n, 2.0 + n, priority=REALTIME) for n in (100, 300, 301))]
    batch = pick_batch(queue, max_size=4, max_tokens=100_000)
    assert sorted(w.priority for w in batch) == [REALTIME, REALTIME, REALTIME, 1]


def test_realtime_requests_enter_the_next_batch_ahead_of_waiting_bulk_ones() -> None:
    # Given a slow model busy with a first batch, 12 bulk requests queued behind it, then
    # 2 realtime ones (of lengths far from the bulk ones')
    model = Recorder(delay_s=0.3)
    batcher = DynamicBatcher(model, max_batch_size=4, max_batch_tokens=100_000, max_wait_s=0)
    try:
        first = batcher.submit("g", 10, 5, 0, priority=BULK)
        time.sleep(0.1)  # the first batch is running now
        bulk = [batcher.submit("g", 10 + n, 5, n, priority=BULK) for n in range(1, 13)]
        realtime = [batcher.submit("g", 900 + n, 5, 900 + n, priority=REALTIME)
                    for n in range(2)]
        for future in [first, *bulk, *realtime]:
            future.result(timeout=10)
    finally:
        batcher.close()
    # Then the batch after the running one holds both realtime requests (first come,
    # first served would run three batches of bulk before them)
    assert {900, 901} <= set(model.batches[1][1])
