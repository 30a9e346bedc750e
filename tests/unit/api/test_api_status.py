"""An error's HTTP status comes from its class, the same on every route, and PostgreSQL or
Redis out of reach is a 503 that says what to check, under /v1 and elsewhere, never a 500."""

from collections.abc import Iterator

import httpx
import pytest
from fastapi.testclient import TestClient

from api.errors import status_of
from cli.client import _raise_for_error
from quotaflow.config import Settings
from quotaflow.errors import (
    AuthenticationError,
    DeploymentNotFound,
    EnqueuedTokenLimit,
    FileNotFound,
    FileTooLarge,
    InputFileError,
    InvalidParameter,
    InvalidRequest,
    JobNotFound,
    JobStateError,
    NotFound,
    PermissionDenied,
    ProviderError,
    QuotaflowError,
    RequestTooLarge,
    ServiceUnavailable,
)
from tests.harness.api_app import app_client

# Ports where nothing listens.
NO_POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:1/nothing"
NO_REDIS = "redis://127.0.0.1:1/0"
KEY = {"Authorization": "Bearer qf-unknown"}


@pytest.mark.parametrize(("error", "status"), [
    (InvalidRequest("x"), 400), (InvalidParameter("queue", "x"), 400),
    (InputFileError("x"), 400), (RequestTooLarge("x"), 400), (EnqueuedTokenLimit("x"), 400),
    (FileTooLarge("x"), 413), (NotFound("x"), 404), (JobNotFound("x"), 404),
    (FileNotFound("x"), 404), (DeploymentNotFound("x"), 404), (AuthenticationError("x"), 401),
    (PermissionDenied("x"), 403), (JobStateError("x"), 409), (ServiceUnavailable("x"), 503),
    # not the request's fault
    (ProviderError("x"), 500), (QuotaflowError("x"), 500),
])
def test_the_status_is_the_error_class(error: QuotaflowError, status: int) -> None:
    assert status_of(error) == status


@pytest.mark.parametrize(("status", "kind"), [
    (400, InvalidRequest), (401, AuthenticationError), (403, PermissionDenied), (404, NotFound),
    (409, JobStateError), (413, FileTooLarge), (422, InvalidRequest), (503, ServiceUnavailable),
])
def test_the_cli_reads_a_status_as_its_error_class(status: int, kind: type) -> None:
    with pytest.raises(kind, match="the message"):
        _raise_for_error(httpx.Response(status, json={"error": {"message": "the message"}}))


@pytest.fixture
def no_database(monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    yield from app_client(Settings(database_url=NO_POSTGRES, broker_url=NO_REDIS, _env_file=None),
                          monkeypatch)


@pytest.fixture
def no_redis(monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    yield from app_client(Settings(database_url=NO_POSTGRES, broker_url=NO_REDIS, auth=False,
                                   _env_file=None), monkeypatch)


def unavailable(answer: httpx.Response) -> str:
    """The message of a 503 in the error shape every route answers in."""
    assert answer.status_code == 503, answer.text
    assert answer.headers["x-request-id"]
    error = answer.json()["error"]
    assert error["type"] == "server_error" and error["param"] is None
    return error["message"]


@pytest.mark.parametrize(("method", "path", "kwargs"), [
    ("GET", "/healthz", {}),
    ("GET", "/jobs", {}),
    ("GET", "/jobs/batch_x", {}),
    ("POST", "/jobs/batch_x/cancel", {}),
    ("POST", "/jobs", {"files": {"file": ("a.jsonl", b'{"prompt": "x"}\n')}}),
    ("GET", "/limits", {}),
    ("GET", "/v1/batches", {}),
    ("GET", "/v1/files/file-x", {}),
    ("POST", "/v1/batches", {"json": {"input_file_id": "file-x",
                                      "endpoint": "/v1/chat/completions"}}),
    ("GET", "/copy", {}),
    ("GET", "/v1/copy", {}),
])
def test_postgres_away_is_a_503_naming_the_setting(no_database: TestClient, method: str,
                                                   path: str, kwargs: dict) -> None:
    message = unavailable(no_database.request(method, path, headers=KEY, **kwargs))
    assert message.startswith("database unreachable (") and "QUOTAFLOW_DATABASE_URL" in message


@pytest.mark.parametrize(("path", "setting"), [
    ("/limits", "QUOTAFLOW_REDIS_URL"), ("/queue", "QUOTAFLOW_BROKER_URL"),
    ("/v1/queue", "QUOTAFLOW_BROKER_URL"),
])
def test_redis_away_is_a_503_naming_the_setting(no_redis: TestClient, path: str,
                                                setting: str) -> None:
    message = unavailable(no_redis.get(path))
    assert "Redis" in message and "unreachable" in message and setting in message
