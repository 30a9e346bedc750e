"""anthropic-beta: a line's `params.betas` and a Message Batch's header, forwarded as the
header and never as a body field."""

import asyncio
import json
from typing import Any

import pytest

from quotaflow.compat.anthropic_batch_body import BatchBodyError, open_requests, with_betas
from quotaflow.compat.anthropic_batches import beta_names
from quotaflow.deployments.deployment import Deployment
from quotaflow.ingest import formats
from quotaflow.offload.clients import AnthropicBatches
from quotaflow.providers.anthropic import AnthropicProvider

PARAMS = {"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}


def test_a_batchs_header_becomes_params_betas_where_a_request_names_none() -> None:
    body = json.dumps({"requests": [
        {"custom_id": "a", "params": PARAMS},
        {"custom_id": "b", "params": {**PARAMS, "betas": ["own-1"]}}]}).encode()
    first, second = (json.loads(line) for line in
                     open_requests(body, 10, ("b-1", "b-2")).read().splitlines())
    assert first["params"]["betas"] == ["b-1", "b-2"]
    assert second["params"]["betas"] == ["own-1"]
    assert with_betas('{"params":{}}', ("x",)) == '{"params":{"betas":["x"]}}'


def test_beta_names_are_checked() -> None:
    assert beta_names(" context-1m-2025-08-07 , files-api-2025-04-14") == (
        "context-1m-2025-08-07", "files-api-2025-04-14")
    assert beta_names(None) == ()
    with pytest.raises(BatchBodyError, match="is not a beta's name"):
        beta_names("ok, bad name")


def test_a_line_with_betas_that_are_not_names_is_refused() -> None:
    def read(params: dict[str, Any]) -> Any:
        return formats.parse_line(1, json.dumps({"custom_id": "a", "params": params}).encode())

    assert isinstance(read({**PARAMS, "betas": ["context-1m-2025-08-07"]}), formats.Request)
    refused = read({**PARAMS, "betas": "context-1m-2025-08-07"})
    assert isinstance(refused, formats.BadLine) and "params.betas must be a list" in str(refused)


class Edge:
    """The edge's post, recorded."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes]] = []

    async def post(self, path: str, body: bytes, head: bytes = b"") -> Any:
        self.sent.append((path, body, head))
        raise RuntimeError("recorded")


def test_the_provider_sends_betas_as_the_header_and_not_in_the_body() -> None:
    claude = AnthropicProvider(Deployment(name="c", provider="anthropic", model="m",
                                          base_url="http://127.0.0.1:9", rpm=60, tpm=1000))
    edge = Edge()
    claude._edge = edge  # type: ignore[assignment]
    body = {**PARAMS, "model": "m", "betas": ["b-1", "b-2"]}
    for sent in (body, PARAMS):
        with pytest.raises(RuntimeError):
            asyncio.run(claude.send("/v1/chat/completions", sent))
    (_, first, head), (_, second, none) = edge.sent
    assert head == b"anthropic-beta: b-1,b-2\r\n" and "betas" not in json.loads(first)
    assert none == b"" and json.loads(second) == PARAMS
    assert body["betas"] == ["b-1", "b-2"]  # the stored body is not changed


def test_a_provider_batch_sends_the_union_of_its_lines_betas() -> None:
    batches = AnthropicBatches(Deployment(name="cb", provider="anthropic-batch", model="m",
                                          base_url="http://127.0.0.1:9"))
    made: dict[str, Any] = {}

    class Batches:
        def create(self, requests: list[dict], extra_headers: dict | None) -> Any:
            made.update(requests=requests, headers=extra_headers)
            return type("Batch", (), {"id": "msgbatch_1"})()

    batches.client = type("Client", (), {"messages": type("M", (), {"batches": Batches()})()})()
    lines = b"".join(json.dumps(batches.request_line(n, "/v1/chat/completions", {
        "_anthropic_params": {**PARAMS, **({"betas": betas} if betas else {})}})).encode()
        + b"\n" for n, betas in enumerate((["b-1"], None, ["b-2", "b-1"])))
    assert batches.submit("batch_x", "/v1/chat/completions", lines) == ("msgbatch_1", None)
    assert made["headers"] == {"anthropic-beta": "b-1,b-2"}
    assert all("betas" not in r["params"] for r in made["requests"])
