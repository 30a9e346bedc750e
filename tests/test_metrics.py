"""The metrics' arithmetic without servers: bulk histogram writes equal one observe() per
value, a run's tally lands on the right series, failures get their code, and every batch
message carries the time it was queued."""

import time
import uuid
from pathlib import Path

import orjson
from prometheus_client import REGISTRY, CollectorRegistry, Histogram

from cli.services import metrics_env
from quotaflow import metrics
from quotaflow.constants import TASK_PROCESS_BATCH
from quotaflow.dispatch import BatchRef
from quotaflow.errors import RetryableProviderError
from quotaflow.gauges import queued_time
from workers.dispatch import QUEUED_AT, CeleryDispatcher, message

VALUES = (0.0, 0.004, 0.005, 0.02, 0.3, 0.3, 7.0, 61.0, 500.0)


def test_bulk_histogram_write_equals_one_observe_per_value() -> None:
    # Given one histogram, its values observed one by one on a child, tallied on another
    registry = CollectorRegistry()
    histogram = Histogram("t_seconds", "t", ["way"], buckets=metrics.LATENCY_BUCKETS,
                          registry=registry)
    for value in VALUES:
        histogram.labels("one").observe(value)
    buckets = metrics._Buckets(metrics.LATENCY_BUCKETS)
    for value in VALUES[:-2]:
        buckets.add(value)
    buckets.add(0.3, 0)  # nothing
    buckets.add(61.0)
    buckets.add(500.0)
    # When the tally is written in one go
    metrics.observe_many(histogram.labels("bulk"), buckets.counts, buckets.total)
    # Then both children hold the same buckets, count and sum
    def value(name: str, way: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"way": way, **labels})

    bounds = [*(repr(b) for b in metrics.LATENCY_BUCKETS), "+Inf"]
    for le in bounds:
        assert value("t_seconds_bucket", "bulk", le=le) == value("t_seconds_bucket", "one", le=le)
    assert value("t_seconds_count", "bulk") == value("t_seconds_count", "one") == len(VALUES)
    assert value("t_seconds_sum", "bulk") == value("t_seconds_sum", "one")


def test_a_runs_tally_is_written_on_flush_only() -> None:
    # Given a tally with two admissions and three answers of a deployment of its own
    name = f"d-{uuid.uuid4().hex[:8]}"
    tally = metrics.Tally("bulk")
    tally.admitted(name, 3, 300, 0.02)
    tally.admitted(name, 1, 100, 2.0)
    tally.answered(name, "200", 0.05, 10, 4)
    tally.answered(name, "200", 0.07, 11, 5)
    tally.answered(name, "429", 0.01)

    def value(metric: str, **labels: str) -> float | None:
        return REGISTRY.get_sample_value(metric, labels)

    assert value("quotaflow_admitted_requests_total", deployment=name, queue="bulk") is None
    # When it is flushed (twice: the second has nothing to add)
    tally.flush()
    tally.flush()
    # Then every series has its sums
    assert value("quotaflow_admitted_requests_total", deployment=name, queue="bulk") == 4
    assert value("quotaflow_admitted_tokens_total", deployment=name, queue="bulk") == 400
    assert value("quotaflow_provider_responses_total", deployment=name, code="200") == 2
    assert value("quotaflow_provider_responses_total", deployment=name, code="429") == 1
    assert value("quotaflow_provider_tokens_total", deployment=name, kind="prompt") == 21
    assert value("quotaflow_provider_tokens_total", deployment=name, kind="completion") == 9
    assert value("quotaflow_provider_latency_seconds_count", deployment=name) == 3
    assert value("quotaflow_provider_latency_seconds_bucket", deployment=name, le="0.05") == 2
    assert abs(value("quotaflow_provider_latency_seconds_sum", deployment=name) - 0.13) < 1e-9


def test_failures_are_labelled_by_status_or_what_kept_them_from_one() -> None:
    def failure(status: int | None = None, cause: BaseException | None = None) -> Exception:
        exc = RetryableProviderError("x", status_code=status)
        exc.__cause__ = cause
        return exc

    assert metrics.error_code(failure(500)) == "500"
    assert metrics.error_code(failure(429)) == "429"
    assert metrics.error_code(failure(cause=TimeoutError())) == "timeout"
    assert metrics.error_code(failure(cause=ConnectionResetError())) == "connection"
    assert metrics.error_code(failure()) == "error"


def test_every_batch_message_carries_when_it_was_queued() -> None:
    # Given the template the dispatcher's pipeline path writes its messages from
    dispatcher = CeleryDispatcher("redis://127.0.0.1:1/0")  # never connected here
    template = dispatcher._celery.amqp.create_task_message(
        str(uuid.uuid4()), TASK_PROCESS_BATCH, ["", 0, 0], reply_to="", ignore_result=None)
    now = time.time()
    # When a message is built with the dispatch's stamp
    raw = orjson.dumps(message(template, "bulk", BatchRef("job", 1, 10), {QUEUED_AT: now}))
    # Then the scrape reads the time back from the stored bytes
    assert queued_time(raw) == now
    assert queued_time(orjson.dumps(message(template, "bulk", BatchRef("job", 1, 10)))) is None
    assert queued_time(b"not json") is None


def test_a_metrics_port_gives_the_worker_a_fresh_directory_of_its_own() -> None:
    assert metrics_env(None) == {}
    first, second = metrics_env(9101), metrics_env(9102)
    assert first["QUOTAFLOW_WORKER_METRICS_PORT"] == "9101"
    directories = [Path(env["PROMETHEUS_MULTIPROC_DIR"]) for env in (first, second)]
    assert directories[0] != directories[1]
    for directory in directories:
        assert directory.is_dir() and not any(directory.iterdir())
        directory.rmdir()
