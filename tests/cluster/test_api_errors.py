"""What the API answers when a request is wrong, on the real API process: OpenAI's error
shape under /v1 (a 400 naming the parameter, never a 500 or a Python class name), an
x-request-id on every answer, and /limits for operator keys only."""

import json
import re
from collections.abc import Iterator

import httpx
import openai
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from tests.harness.factories import chat_line, jsonl
from tests.harness.openai_cluster import V1Cluster, start_cluster

CHAT = "/v1/chat/completions"
REQUEST_ID = re.compile(r"^req_[0-9a-f]{32}$")
DEEP = "[" * 100_000 + "]" * 100_000


@pytest.fixture(scope="module")
def cluster(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[V1Cluster]:
    yield from start_cluster(pg_url, tmp_path_factory.mktemp("errors"), workers=0)


@pytest.fixture(scope="module")
def file_id(cluster: V1Cluster) -> str:
    uploaded = httpx.post(f"{cluster.base_url}/files", headers=cluster.headers("team-a"),
                          files={"file": ("a.jsonl", jsonl([chat_line("a")]))},
                          data={"purpose": "batch"}, timeout=30)
    return uploaded.raise_for_status().json()["id"]


def openai_error(response: httpx.Response, status: int) -> dict:
    """The answer's error object, checked to be OpenAI's and to carry a request id."""
    assert response.status_code == status, response.text
    assert REQUEST_ID.match(response.headers["x-request-id"])
    error = response.json()["error"]
    assert {"message", "type", "param", "code"} <= set(error)
    assert error["type"] == ("server_error" if status >= 500 else "invalid_request_error")
    return error


def batch_body(file_id: str, **fields: object) -> dict:
    return {"input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h", **fields}


def test_bad_parameters_are_400s_naming_them(cluster: V1Cluster, file_id: str) -> None:
    headers = cluster.headers("team-a")
    post_batch = f"{cluster.base_url}/batches"
    for content, param in (
            # the body does not parse (Python's json recurses): no parameter to name
            (json.dumps(batch_body(file_id)).replace('"24h"', '"24h", "metadata": ' + DEEP),
             None),
            # (pydantic names the key as it can: "metadata.<key>.[key]")
            (json.dumps(batch_body(file_id, metadata={"\ud800": "x"})), "metadata.*"),
            (json.dumps(batch_body(file_id, metadata={"a": "\ud800"})), "metadata.a"),
            (json.dumps(batch_body(file_id, endpoint="\ud800")), "endpoint"),
            (json.dumps(batch_body(file_id, metadata={"a": float("nan")})), "metadata.a")):
        answer = httpx.post(post_batch, content=content, timeout=30,
                            headers=headers | {"Content-Type": "application/json"})
        named = openai_error(answer, 400)["param"]
        assert named == param or ((param or "").endswith("*") and named.startswith(param[:-1]))
    for fields, param in (({"endpoint": "/v1/images"}, "endpoint"),
                          ({"completion_window": "1y"}, "completion_window")):
        answer = httpx.post(post_batch, json=batch_body(file_id, **fields), headers=headers)
        assert openai_error(answer, 400)["param"] == param
    queue = httpx.post(post_batch, json=batch_body(file_id),
                       headers=headers | {"X-Quotaflow-Queue": "later"})
    assert openai_error(queue, 400)["param"] == "X-Quotaflow-Queue"
    job = httpx.post(f"{cluster.api_url}/jobs", headers=headers, data={"queue": "later"},
                     files={"file": ("a.jsonl", jsonl([chat_line("q")]))}, timeout=30)
    assert openai_error(job, 400)["param"] == "queue"  # the same unknown queue, the same 400
    listed = httpx.get(f"{cluster.base_url}/files", params={"purpose": "\x00"}, headers=headers)
    assert openai_error(listed, 400)["param"] == "purpose"
    upload = httpx.post(f"{cluster.base_url}/files", headers=headers, data={"purpose": "x"},
                        files={"file": ("a.jsonl", b"{}\n")})
    assert openai_error(upload, 400)["param"] == "purpose"
    # The SDK reads them as it reads OpenAI's
    client = openai.OpenAI(base_url=cluster.base_url, api_key=cluster.keys["team-a"],
                           max_retries=0)
    with pytest.raises(openai.BadRequestError) as refused:
        client.batches.create(input_file_id=file_id, endpoint="/v1/images",  # type: ignore
                              completion_window="24h")
    assert refused.value.param == "endpoint" and refused.value.type == "invalid_request_error"


@pytest.mark.parametrize(("metadata", "reason"), [
    ('{"a": ' + DEEP + "}", "JSON object of string values"),
    ('{"seed": ' + "9" * 5000 + "}", "JSON object of string values"),
    ('{"a": "\\ud800"}', "lone surrogates"),
    ('{"a": NaN}', "JSON object of string values"),
    ("[1", "must be a JSON object"),
])
def test_bad_job_metadata_is_a_400_naming_it(cluster: V1Cluster, metadata: str,
                                             reason: str) -> None:
    answer = httpx.post(f"{cluster.api_url}/jobs", headers=cluster.headers("team-a"),
                        files={"file": ("a.jsonl", jsonl([chat_line("m")]))},
                        data={"metadata": metadata}, timeout=30)
    error = openai_error(answer, 400)
    assert error["param"] == "metadata" and reason in error["message"]


def test_every_answer_has_a_request_id_and_openais_error_shape(cluster: V1Cluster,
                                                               file_id: str) -> None:
    headers = cluster.headers("team-a")
    seen = set()
    for method, path, status in (("GET", "/healthz", 200), ("GET", "/v1/batches", 200),
                                 ("GET", f"/v1/files/{file_id}/content", 200),
                                 ("GET", "/jobs", 200), ("GET", "/v1/files/file-none", 404),
                                 ("POST", "/v1/batches/batch_none/cancel", 404),
                                 ("GET", "/v1/nowhere", 404), ("PUT", "/v1/batches", 405)):
        answer = httpx.request(method, cluster.api_url + path, headers=headers)
        assert answer.status_code == status, (path, answer.text)
        assert REQUEST_ID.match(answer.headers["x-request-id"]), path
        seen.add(answer.headers["x-request-id"])
        if status >= 400:
            assert openai_error(answer, status)["code"] is None
    assert len(seen) == 8  # one id per request
    unauthorised = openai_error(httpx.get(f"{cluster.base_url}/batches"), 401)
    assert unauthorised["code"] == "invalid_api_key"
    assert "FileNotFound" not in httpx.get(f"{cluster.base_url}/files/file-none",
                                           headers=headers).text


def test_an_unexpected_failure_is_openais_server_error_with_the_request_id() -> None:
    app = create_app()

    @app.get("/v1/boom")
    def boom() -> None:
        raise RuntimeError("a bug")

    answer = TestClient(app, raise_server_exceptions=False).get("/v1/boom")
    error = openai_error(answer, 500)  # type: ignore[arg-type]
    assert answer.headers["x-request-id"] in error["message"] and "a bug" not in error["message"]


def test_limits_need_an_operator_key(cluster: V1Cluster) -> None:
    tenant_key = httpx.get(f"{cluster.api_url}/limits", headers=cluster.headers("team-a"))
    assert "--operator" in openai_error(tenant_key, 403)["message"]
    assert openai_error(httpx.get(f"{cluster.api_url}/limits/fast",
                                  headers=cluster.headers("team-a")), 403)
    operator = {"Authorization": f"Bearer {cluster.create_key('ops', '--operator')}"}
    shown = httpx.get(f"{cluster.api_url}/limits", headers=operator)
    assert shown.status_code == 200
    assert {row["deployment"] for row in shown.json()["data"]} == {"fast", "slow"}
    assert httpx.get(f"{cluster.api_url}/limits/fast", headers=operator).json()["rpm"] == 60000
    # and the CLI shows them with an operator key, and says what is missing without one
    env = {**cluster.env, "QUOTAFLOW_API_KEY": operator["Authorization"].split()[1]}
    assert "fast" in cluster.cli("limits", env=env).stdout
    refused = cluster.cli("limits", env={**cluster.env,
                                         "QUOTAFLOW_API_KEY": cluster.keys["team-a"]})
    assert refused.returncode == 1 and "needs an operator key" in refused.stderr
    listed = cluster.cli("keys", "list").stdout.splitlines()
    assert [line.endswith("operator") for line in listed if " ops " in line] == [True]
    assert not any(line.endswith("operator") for line in listed if " team-a " in line)
