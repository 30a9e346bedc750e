"""QUOTAFLOW_METRICS_TOKEN (issue 30, part 4): /metrics answers only a scrape that carries
it as Prometheus sends it (`authorization: Bearer ...`). The real API and worker answer
it in tests/cluster/test_metrics_cluster.py; here the rule and the worker's WSGI guard."""

import pytest
from prometheus_client import CollectorRegistry, Counter, make_wsgi_app
from pydantic import SecretStr

from quotaflow.config import Settings
from quotaflow.observe.metrics_auth import authorized
from workers.metrics import collected, guarded

TOKEN = SecretStr("s3cret-scrape-token")


@pytest.mark.parametrize(("header", "allowed"), [
    ("Bearer s3cret-scrape-token", True), ("bearer s3cret-scrape-token", True),
    (None, False), ("", False), ("Bearer wrong", False), ("Basic s3cret-scrape-token", False),
    ("Bearer s3cret-scrape-token-and-more", False), ("s3cret-scrape-token", False)])
def test_only_the_bearer_token_is_let_through(header: str | None, allowed: bool) -> None:
    assert authorized(header, TOKEN) is allowed


def test_without_a_token_metrics_stay_open() -> None:
    assert authorized(None, None) and authorized("Bearer anything", None)


def test_an_empty_variable_is_no_token(monkeypatch: pytest.MonkeyPatch) -> None:
    # compose passes ${QUOTAFLOW_METRICS_TOKEN:-}: unset there must not lock Prometheus out
    monkeypatch.setenv("QUOTAFLOW_METRICS_TOKEN", "")
    assert Settings().metrics_token is None
    monkeypatch.setenv("QUOTAFLOW_METRICS_TOKEN", "abc")
    assert Settings().metrics_token.get_secret_value() == "abc"


def _scrape(token: SecretStr | None, header: str | None) -> tuple[str, bytes]:
    registry = CollectorRegistry()
    Counter("quotaflow_demo", "demo", registry=registry).inc()
    app = guarded(make_wsgi_app(registry), token)
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", "QUERY_STRING": "",
               "SERVER_NAME": "x", "SERVER_PORT": "9101", "wsgi.url_scheme": "http"}
    if header is not None:
        environ["HTTP_AUTHORIZATION"] = header
    status: list[str] = []
    body = b"".join(app(environ, lambda s, _headers, _exc=None: status.append(s)))
    return status[0], body


def test_the_workers_endpoint_asks_for_the_token() -> None:
    status, body = _scrape(TOKEN, None)
    assert status.startswith("401") and b"quotaflow_demo" not in body
    assert _scrape(TOKEN, "Bearer nope")[0].startswith("401")
    status, body = _scrape(TOKEN, "Bearer s3cret-scrape-token")
    assert status.startswith("200") and b"quotaflow_demo_total 1.0" in body
    assert _scrape(None, None)[0].startswith("200")


def test_a_worker_counts_only_where_its_counts_are_served(monkeypatch) -> None:
    # Given no metrics directory (a worker started without --metrics-port)
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    # Then its batch runs count nothing
    assert not collected()
    # And given the directory `quotaflow worker --metrics-port` sets (a companion shares it)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "/tmp/quotaflow-metrics-x")
    assert collected()
