"""The metrics without servers: bulk histogram writes equal one observe() per value, a
run's tally lands on the right series, failures get their code, every batch message
carries the time it was queued, and the API's gauges read the state (in-process limiter
and breaker, SQLite)."""

import time
import uuid
from pathlib import Path

import orjson
from prometheus_client import REGISTRY, CollectorRegistry, Histogram, generate_latest

from cli.services import metrics_env
from quotaflow.config import Settings
from quotaflow.constants import TASK_PROCESS_BATCH
from quotaflow.db import upgrade
from quotaflow.dispatch.queues import BatchRef
from quotaflow.errors import RetryableProviderError
from quotaflow.models import Item, Job
from quotaflow.observe import metrics
from quotaflow.observe.gauges import StateCollector, queued_time
from quotaflow.runtime import Runtime
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


def test_the_apis_gauges_read_budgets_circuits_and_statuses_now(tmp_path: Path) -> None:
    # Given an in-process runtime (no broker) with one deployment, half its budget taken,
    # its circuit opened by failures, and one job of three requests
    deployments = tmp_path / "deployments.toml"
    deployments.write_text('[deployments.gauged]\nprovider = "mock"\nmodel = "m"\nrpm = 100\n'
                           'tpm = 10000\ncircuit_failures = 2\n[routes]\n"*" = "gauged"\n')
    url = f"sqlite:///{tmp_path / 'g.db'}"
    upgrade(url)
    runtime = Runtime(Settings(database_url=url, deployments_file=deployments,
                               _env_file=None), in_process=True)
    deployment = runtime.deployments.deployments["gauged"]
    runtime.limiter.acquire(deployment.budget, [5000], 0.0)
    runtime.breaker.record_failure(deployment)
    runtime.breaker.record_failure(deployment)
    with runtime.sessions.begin() as session:
        session.add(Job(id="j1", status="in_progress", queue="bulk", endpoint="/v1/x"))
        session.flush()  # items have no relationship to order them after their job
        session.add_all(Item(job_id="j1", line_no=n, status=status) for n, status in
                        enumerate(("pending", "running", "succeeded")))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StateCollector(runtime))

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    # When they are collected
    page = generate_latest(registry).decode()
    # Then each reads what is there now
    assert 0.49 < value("quotaflow_budget_utilisation", deployment="gauged") < 0.51
    assert value("quotaflow_budget_limit_tokens_per_minute", deployment="gauged") == 10000
    assert value("quotaflow_budget_limit_requests_per_minute", deployment="gauged") == 100
    assert 4999 < value("quotaflow_budget_available_tokens", deployment="gauged") < 5100
    assert value("quotaflow_circuit_state", deployment="gauged") == 2
    assert value("quotaflow_requests", status="pending") == 1
    assert value("quotaflow_requests", status="succeeded") == 1
    assert value("quotaflow_requests", status="failed") == 0
    assert value("quotaflow_jobs", status="in_progress") == 1
    assert value("quotaflow_metrics_source_up", source="database") == 1
    assert "quotaflow_queue_depth" not in page  # no broker to read
