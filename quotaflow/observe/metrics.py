"""The workers' Prometheus counters and histograms, and the tally that feeds them in bulk.

What happens in a worker (admissions, provider answers, their latency and
tokens) is counted here; what lives in Redis or PostgreSQL (bucket levels,
circuits, queue depths, items by status) is read when scraped
(quotaflow/observe/gauges.py, served by the API), so that it is counted once however
many workers there are.

A worker started with `--metrics-port` runs with PROMETHEUS_MULTIPROC_DIR set
(cli/services.py): every pool process writes its values to its own mmapped
files there, and the worker's main process serves their sum
(workers/metrics.py). A multiprocess increment costs a lock and a write to the
mmap, too much to pay several times per request: so
the execution loop records into a `Tally` of plain integers (a run's metrics
hook, execution/policies/metrics_hook.py), and the tally writes to the metrics when
the loop already settles its feedback (every 64 calls or 20 ms, feedback.py)
and at the run's end: one write per label set and bucket per flush, not one
per request.
"""

import bisect
from collections.abc import Sequence
from typing import Any

from prometheus_client import Counter, Histogram

# Seconds; a provider call, and a request's wait in the worker for its admission.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                   120.0)
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

ADMITTED_REQUESTS = Counter(
    "quotaflow_admitted_requests_total", "Requests admitted by the limiter (retries pay again)",
    ["deployment", "queue"])
ADMITTED_TOKENS = Counter(
    "quotaflow_admitted_tokens_total", "Tokens admitted by the limiter (admission estimates)",
    ["deployment", "queue"])
ADMISSION_WAIT = Histogram(
    "quotaflow_admission_wait_seconds",
    "Seconds from a batch's claim (or a retry's ask) to a request's admission",
    ["queue"], buckets=WAIT_BUCKETS)
PROVIDER_RESPONSES = Counter(
    "quotaflow_provider_responses_total",
    "Provider calls by outcome: the HTTP status, or timeout, connection, error",
    ["deployment", "code"])
PROVIDER_LATENCY = Histogram(
    "quotaflow_provider_latency_seconds", "Seconds a provider call took, whatever its outcome",
    ["deployment"], buckets=LATENCY_BUCKETS)
PROVIDER_TOKENS = Counter(
    "quotaflow_provider_tokens_total", "Tokens the providers reported using (usage)",
    ["deployment", "kind"])

# Children by label values: .labels() costs about as much as the increment itself.
_children: dict[tuple[Any, tuple[str, ...]], Any] = {}


def _child(metric: Any, *labels: str) -> Any:
    key = (metric, labels)
    child = _children.get(key)
    if child is None:
        child = _children[key] = metric.labels(*labels)
    return child


class _Buckets:
    """A histogram's counts between two writes: per bucket, and their sum."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.total = 0.0

    def add(self, value: float, times: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += times
        self.total += value * times


def observe_many(child: Any, counts: Sequence[int], total: float) -> None:
    """Add bucket counts and their sum to a histogram child in one write each, as that many
    observe() calls would (prometheus_client has no bulk observe; its buckets are
    per-bucket counts, le is the cumulative sum made at collection).
    tests/unit/observe/test_metrics.py checks the result against observe()."""
    buckets = child._buckets
    assert len(buckets) == len(counts), "bucket bounds differ from the histogram's"
    for value, count in zip(buckets, counts, strict=True):
        if count:
            value.inc(count)
    child._sum.inc(total)


class Tally:
    """One batch run's counts in plain integers, written to the metrics by flush()."""

    def __init__(self, queue: str = "") -> None:
        self.queue = queue
        self._dirty = False
        self._admitted: dict[str, list[int]] = {}  # deployment: [requests, tokens]
        self._waits = _Buckets(WAIT_BUCKETS)
        self._responses: dict[tuple[str, str], int] = {}
        self._latency: dict[str, _Buckets] = {}
        self._tokens: dict[str, list[int]] = {}  # deployment: [prompt, completion]

    def admitted(self, deployment: str, requests: int, tokens: int, wait_s: float) -> None:
        """`requests` admitted at once to `deployment`, costing `tokens`, after `wait_s`."""
        entry = self._admitted.get(deployment)
        if entry is None:
            entry = self._admitted[deployment] = [0, 0]
        entry[0] += requests
        entry[1] += tokens
        self._waits.add(wait_s, requests)
        self._dirty = True

    def answered(self, deployment: str, code: str, latency_s: float, prompt_tokens: int = 0,
                 completion_tokens: int = 0) -> None:
        """A provider call ended: its outcome's code, its latency and the usage it reported."""
        key = (deployment, code)
        self._responses[key] = self._responses.get(key, 0) + 1
        buckets = self._latency.get(deployment)
        if buckets is None:
            buckets = self._latency[deployment] = _Buckets(LATENCY_BUCKETS)
        buckets.add(latency_s)
        if prompt_tokens or completion_tokens:
            tokens = self._tokens.get(deployment)
            if tokens is None:
                tokens = self._tokens[deployment] = [0, 0]
            tokens[0] += prompt_tokens
            tokens[1] += completion_tokens
        self._dirty = True

    def flush(self) -> None:
        """Write what was counted since the last flush; nothing to do costs one test."""
        if not self._dirty:
            return
        self._dirty = False
        for deployment, (requests, tokens) in self._admitted.items():
            _child(ADMITTED_REQUESTS, deployment, self.queue).inc(requests)
            _child(ADMITTED_TOKENS, deployment, self.queue).inc(tokens)
        if self._admitted:
            observe_many(_child(ADMISSION_WAIT, self.queue), self._waits.counts,
                         self._waits.total)
            self._admitted, self._waits = {}, _Buckets(WAIT_BUCKETS)
        for (deployment, code), count in self._responses.items():
            _child(PROVIDER_RESPONSES, deployment, code).inc(count)
        for deployment, buckets in self._latency.items():
            observe_many(_child(PROVIDER_LATENCY, deployment), buckets.counts, buckets.total)
        for deployment, (prompt, completion) in self._tokens.items():
            _child(PROVIDER_TOKENS, deployment, "prompt").inc(prompt)
            _child(PROVIDER_TOKENS, deployment, "completion").inc(completion)
        self._responses, self._latency, self._tokens = {}, {}, {}


def error_code(exc: BaseException) -> str:
    """A failed call's `code` label: its HTTP status, or what kept it from having one."""
    status = getattr(exc, "status_code", None)
    if status is not None:
        return str(status)
    if isinstance(exc.__cause__, TimeoutError):
        return "timeout"
    return "connection" if exc.__cause__ is not None else "error"

