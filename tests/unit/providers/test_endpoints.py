"""/v1/responses and /v1/moderations lines: accepted and refused field by field, counted
at admission (text, images by OpenAI's rule, files), answered by the in-process mock,
and refused by deployments that do not serve them (quotaflow/providers/capabilities.py)."""

import asyncio
import base64
import io
import json
import struct
from typing import Any

import pytest

from quotaflow.budget.image_tokens import UNKNOWN_IMAGE_TOKENS, data_url_size, high_detail_tokens
from quotaflow.budget.tokens import admission_tokens, max_output_tokens, prompt_parts, prompt_tokens
from quotaflow.config import Settings
from quotaflow.constants import ENDPOINTS
from quotaflow.deployments.catalog import Deployments, Route
from quotaflow.deployments.deployment import Deployment
from quotaflow.execution.loops import ProviderPool
from quotaflow.execution.prepare import Preparer
from quotaflow.ingest.estimate import scan_file
from quotaflow.ingest.formats import BadLine, Request, parse_stream
from quotaflow.offload.clients import OpenAIBatches
from quotaflow.offload.results import read_line
from quotaflow.providers.base import ProviderResponse
from quotaflow.providers.capabilities import SERVES, serves, serving_route, unserved
from quotaflow.providers.mock import MockProvider
from quotaflow.providers.outcomes import Failure, FailureCode
from quotaflow.results.leases import ClaimedItem
from tests.harness.factories import jsonl

RESPONSES, MODERATIONS, CHAT = "/v1/responses", "/v1/moderations", "/v1/chat/completions"


def line(url: str, body: dict[str, Any], custom_id: str = "a") -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def parse_one(url: str, body: dict[str, Any]) -> Request | BadLine:
    [entry] = list(parse_stream(io.BytesIO(jsonl([line(url, body)])), 1 << 20))
    return entry


def png_data_url(width: int, height: int, payload: int = 30_000) -> str:
    """A PNG data URL with that header and `payload` bytes after it (never decoded)."""
    header = (b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR"
              + struct.pack(">II", width, height) + b"\x08\x02\x00\x00\x00")
    return "data:image/png;base64," + base64.b64encode(header + b"\x00" * payload).decode()


# --- formats -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("url", "body"), [
    (RESPONSES, {"model": "m", "input": "Say hi"}),
    (RESPONSES, {"model": "m", "instructions": "Be brief.", "max_output_tokens": 40, "input": [
        {"role": "user", "content": [
            {"type": "input_text", "text": "What is this?"},
            {"type": "input_image", "image_url": "https://example.com/a.png", "detail": "low"},
            {"type": "input_file", "file_id": "file-abc"}]},
        {"type": "function_call_output", "call_id": "c1", "output": "42"}]}),
    (MODERATIONS, {"model": "omni-moderation-latest", "input": "some text"}),
    (MODERATIONS, {"input": ["one", "two"]}),
    (MODERATIONS, {"input": [{"type": "text", "text": "look"},
                             {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}),
])
def test_responses_and_moderations_lines_are_accepted_as_written(url: str, body: dict) -> None:
    assert parse_one(url, body) == Request(1, "a", url, body)


@pytest.mark.parametrize(("url", "body", "reason"), [
    (RESPONSES, {"model": "m"}, "body.input is required for /v1/responses"),
    (RESPONSES, {"input": []}, "body.input is required for /v1/responses"),
    (RESPONSES, {"input": "x", "instructions": 3}, "body.instructions must be a string"),
    (RESPONSES, {"input": "x", "max_output_tokens": 0},
     "body.max_output_tokens must be a positive integer"),
    (RESPONSES, {"input": ["hi"]}, "body.input[0] must be an object"),
    (RESPONSES, {"input": [{"content": "hi"}]}, "body.input[0] must be a message (role"),
    (RESPONSES, {"input": [{"role": "user", "content": [{"type": "image", "url": "u"}]}]},
     "body.input[0].content[0] must be a content part with type input_text"),
    (RESPONSES, {"input": [{"role": "user", "content": "ok"},
                           {"role": "user", "content": [{"type": "input_image"}]}]},
     "body.input[1].content[0] (input_image) needs image_url or file_id"),
    (RESPONSES, {"input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "u", "detail": "huge"}]}]},
     "body.input[0].content[0].detail must be one of low, high, auto"),
    (RESPONSES, {"input": [{"role": "user", "content": [{"type": "input_file"}]}]},
     "(input_file) needs file_data or file_id or file_url"),
    (MODERATIONS, {"model": "m"}, "body.input is required for /v1/moderations"),
    (MODERATIONS, {"input": 7}, "body.input is required for /v1/moderations"),
    (MODERATIONS, {"input": ["text", {"type": "text", "text": "mixed"}]},
     "body.input[0] must be a {type: text, text} or {type: image_url"),
    (MODERATIONS, {"input": [{"type": "image_url", "image_url": "https://x"}]},
     "body.input[0].image_url must be an object with a url"),
    (MODERATIONS, {"input": [{"type": "text", "text": 5}]}, "body.input[0].text must be a string"),
])
def test_bad_bodies_are_refused_naming_the_field(url: str, body: dict, reason: str) -> None:
    entry = parse_one(url, body)
    assert isinstance(entry, BadLine) and reason in entry.reason, entry


def test_every_openai_batch_endpoint_is_accepted_and_others_named_in_the_refusal() -> None:
    assert set(ENDPOINTS) == {"/v1/responses", "/v1/chat/completions", "/v1/completions",
                              "/v1/embeddings", "/v1/moderations"}
    entry = parse_one("/v1/images/generations", {"prompt": "x"})
    assert isinstance(entry, BadLine)
    assert "/v1/responses" in entry.reason and "/v1/moderations" in entry.reason


# --- tokens ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("size", "tokens"), [
    ((1024, 1024), 765),   # OpenAI's examples: scaled to 768 x 768, 4 tiles
    ((2048, 4096), 1105),  # to 1024 x 2048, then 768 x 1536: 6 tiles
    ((500, 500), 255),     # never scaled up: 1 tile
    ((513, 513), 765),
    ((768, 2048), 1445),   # the most a high-detail image can cost: 8 tiles
    ((4000, 100), 765),    # 2048 x 51: 4 x 1 tiles
])
def test_high_detail_images_cost_by_tiles(size: tuple[int, int], tokens: int) -> None:
    assert high_detail_tokens(*size) == tokens


def test_image_size_is_read_from_a_data_url_header_only() -> None:
    assert data_url_size(png_data_url(2048, 4096)) == (2048, 4096)
    gif = base64.b64encode(b"GIF89a" + struct.pack("<HH", 300, 200) + b"\x00" * 40).decode()
    assert data_url_size(f"data:image/gif;base64,{gif}") == (300, 200)
    assert data_url_size("data:image/jpeg;base64,/9j/4AAQSkZJRgABAQAAAQABAAD") is None
    assert data_url_size("data:text/plain,hello") is None


def test_an_image_costs_by_detail_and_size_never_by_its_base64() -> None:
    big = png_data_url(2048, 4096, payload=300_000)  # 400,000 base64 characters
    def chat(image: dict) -> dict:
        return {"messages": [{"role": "user", "content": [
            {"type": "text", "text": "12345678"}, {"type": "image_url", "image_url": image}]}]}
    # Then the text is 2 tokens and the image 1105 (high), 85 (low), 765 (a URL: unknown size)
    assert prompt_tokens(CHAT, chat({"url": big})) == 2 + 1105
    assert prompt_tokens(CHAT, chat({"url": big, "detail": "low"})) == 2 + 85
    assert prompt_tokens(CHAT, chat({"url": "https://x/y.jpg", "detail": "auto"})) == (
        2 + UNKNOWN_IMAGE_TOKENS) == 2 + 765
    # And the same in a /v1/responses input_image part
    body = {"input": [{"role": "user", "content": [
        {"type": "input_text", "text": "12345678"},
        {"type": "input_image", "image_url": big, "detail": "high"}]}]}
    assert prompt_parts(RESPONSES, body) == ("12345678", 1105)


def test_responses_count_input_instructions_and_max_output_tokens() -> None:
    body = {"instructions": "x" * 40, "input": "y" * 80, "max_output_tokens": 50}
    # "x"*40 + "\n" + "y"*80 = 121 characters = 31 tokens, plus the 50 output ceiling
    assert admission_tokens(RESPONSES, body, default_max_tokens=999) == 31 + 50
    assert admission_tokens(RESPONSES, {"input": "y" * 80}, default_max_tokens=100) == 120
    assert max_output_tokens({"max_output_tokens": 7}, 100) == 7
    items = {"input": [{"role": "system", "content": "abcd"},
                       {"role": "user", "content": [{"type": "input_text", "text": "efgh"},
                                                    {"type": "input_file", "file_id": "f"}]}]}
    assert prompt_parts(RESPONSES, items) == ("abcd\nefgh", 1000)  # a file: one page's
    data = "data:application/pdf;base64," + "A" * 640_000
    assert prompt_parts(RESPONSES, {"input": [{"role": "user", "content": [
        {"type": "input_file", "file_data": data, "filename": "a.pdf"}]}]})[1] == 10_000


def test_moderations_and_embeddings_have_no_output_tokens() -> None:
    assert admission_tokens(MODERATIONS, {"input": "x" * 40, "max_tokens": 500}, 100) == 10
    assert admission_tokens(MODERATIONS, {"input": ["x" * 20, "y" * 19]}, 100) == 10
    parts = {"input": [{"type": "text", "text": "x" * 40},
                       {"type": "image_url", "image_url": {"url": png_data_url(512, 512)}}]}
    assert admission_tokens(MODERATIONS, parts, 100) == 10 + 255
    assert admission_tokens("/v1/embeddings", {"input": "x" * 40}, 100) == 10


def test_estimate_counts_images_beside_the_tokenizer() -> None:
    image = {"type": "input_image", "image_url": png_data_url(1024, 1024)}
    body = {"model": "gpt-4o-mini", "max_output_tokens": 10, "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "hello"}, image]}]}
    gpt = _deployment("gpt-4o-mini", "openai")
    found = scan_file(io.BytesIO(jsonl([line(RESPONSES, body)])), Settings(),
                      Deployments(deployments={gpt.name: gpt}, routes={}), "standard")
    assert found.scan.valid == 1
    assert found.counts.tallies[gpt.name].prompt_tokens == 1 + 765  # o200k: "hello" is one token
    tally = found.scan.routes[gpt.name]
    assert (tally.prompt_tokens, tally.max_completion_tokens) == (2 + 765, 10)  # chars / 4


# --- capabilities ------------------------------------------------------------------------------


def _deployment(name: str, provider: str) -> Deployment:
    extra: dict[str, Any] = {"model_path": "/nowhere"} if provider == "local" else {}
    if provider != "mock":
        extra["base_url"] = "http://127.0.0.1:9/v1"
    return Deployment(name=name, provider=provider, model=name, rpm=60, tpm=100_000, **extra)


def test_the_capability_table_is_the_documented_one() -> None:
    every = set(ENDPOINTS)
    assert {kind: set(urls) for kind, urls in SERVES.items()} == {
        "openai": every, "openai-batch": every, "mock": every,
        "local": {"/v1/chat/completions", "/v1/completions", "/v1/embeddings"},
        "anthropic": {CHAT}, "anthropic-batch": {CHAT}, "gemini": {CHAT}, "vertex": {CHAT},
        "bedrock": {CHAT}, "azure": {"/v1/chat/completions", "/v1/completions", "/v1/embeddings"},
        "azure-batch": {CHAT}}


def test_a_deployment_that_cannot_serve_the_endpoint_fails_the_line_naming_both() -> None:
    llama, claude, gpt = (_deployment("llama", "local"), _deployment("claude", "anthropic"),
                          _deployment("gpt", "openai"))
    deployments = Deployments(deployments={d.name: d for d in (llama, claude, gpt)}, routes={})
    preparer = Preparer(deployments, ProviderPool())
    item = ClaimedItem(1, "a", {"model": "x", "input": "hi"}, 0)
    refused = preparer.prepare(MODERATIONS, llama, item)
    assert refused == Failure(FailureCode.UNSUPPORTED_ENDPOINT, (
        "deployment 'llama' (provider local) does not serve /v1/moderations; route this "
        "model to a deployment that does (docs/deployments/index.md, \"Provider kinds\")"))
    assert str(FailureCode.UNSUPPORTED_ENDPOINT) == "unsupported_endpoint"
    refused = preparer.prepare(RESPONSES, claude, item)
    assert isinstance(refused, Failure) and "'claude' (provider anthropic)" in refused.message

    async def served() -> object:  # providers are made in the running loop
        return preparer.prepare(RESPONSES, gpt, item)

    assert not isinstance(asyncio.run(served()), Failure)
    assert serves(gpt, MODERATIONS) and serves(llama, CHAT) and not serves(claude, MODERATIONS)
    assert unserved(claude, CHAT) is None


def test_a_route_is_narrowed_to_the_deployments_that_serve_the_endpoint() -> None:
    table = {d.name: d for d in (_deployment("llama", "local"), _deployment("claude", "anthropic"),
                                 _deployment("gpt", "openai"), _deployment("mock", "mock"))}
    deployments = Deployments(deployments=table, routes={})
    route = Route(deployments=["claude", "gpt"], fallback=["llama", "mock"])
    assert serving_route(route, deployments, CHAT) is route  # every one serves chat
    assert serving_route(route, deployments, RESPONSES) == Route(deployments=["gpt"],
                                                                 fallback=["mock"])
    only_fallback = Route(deployments=["claude"], fallback=["llama", "gpt", "mock"])
    assert serving_route(only_fallback, deployments, MODERATIONS) == Route(
        deployments=["gpt"], fallback=["mock"])
    assert serving_route(Route(deployments=["claude", "llama"]), deployments,
                         MODERATIONS) is None


# --- the in-process mock -----------------------------------------------------------------------


def test_the_mock_answers_a_response_object_with_responses_usage() -> None:
    body = {"model": "gpt-4.1", "instructions": "Be brief.", "max_output_tokens": 64,
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi there"}]}]}
    answer = asyncio.run(MockProvider().send(RESPONSES, body))
    response = answer.body
    assert response["object"] == "response" and response["status"] == "completed"
    assert response["id"].startswith("resp_") and response["model"] == "gpt-4.1"
    [message] = response["output"]
    assert message["type"] == "message" and message["role"] == "assistant"
    assert message["content"][0] == {"type": "output_text", "annotations": [],
                                     "text": "simulated reply to: Hi there"}
    usage = response["usage"]
    assert usage["input_tokens"] == prompt_tokens(RESPONSES, body)
    assert usage["input_tokens_details"] == {"cached_tokens": 0}
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    # quotaflow reads it as prompt and completion tokens, as it bills and settles them
    assert (answer.prompt_tokens, answer.completion_tokens) == (
        usage["input_tokens"], usage["output_tokens"])


def test_the_mock_answers_moderation_objects_one_result_per_input() -> None:
    answer = asyncio.run(MockProvider().send(MODERATIONS, {
        "model": "omni-moderation-latest", "input": ["a calm sentence", "graphic violence"]}))
    body = answer.body
    assert body["id"].startswith("modr-") and body["model"] == "omni-moderation-latest"
    calm, violent = body["results"]
    assert not calm["flagged"] and violent["flagged"] and violent["categories"]["violence"]
    assert set(calm["category_scores"]) == set(calm["categories"])
    assert "usage" not in body and answer.prompt_tokens == answer.completion_tokens == 0
    [mixed] = asyncio.run(MockProvider().send(MODERATIONS, {"input": [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]})).body["results"]
    assert mixed["category_applied_input_types"]["violence"] == ["text", "image"]
    assert mixed["category_applied_input_types"]["hate"] == ["text"]
    json.dumps(body)  # plain JSON, as stored


# --- provider batches (openai-batch) -----------------------------------------------------------


def test_a_provider_batch_sends_the_line_as_written_and_reads_responses_usage() -> None:
    batch = _deployment("gpt-batch", "openai-batch")
    client = OpenAIBatches(batch)
    try:
        body = {"model": "theirs", "input": "hi", "max_output_tokens": 9}
        assert client.request_line(7, RESPONSES, body) == {
            "custom_id": "q7", "method": "POST", "url": RESPONSES,
            "body": {**body, "model": "gpt-batch"}}  # only the model is the deployment's
    finally:
        client.close()
    response = {"object": "response", "output": [], "usage": {
        "input_tokens": 36, "input_tokens_details": {"cached_tokens": 4}, "output_tokens": 87,
        "output_tokens_details": {"reasoning_tokens": 10}, "total_tokens": 123}}
    result = read_line({"custom_id": "q7", "response": {
        "status_code": 200, "request_id": "req_1", "body": response}, "error": None},
        "openai-batch")
    assert result is not None and isinstance(result.outcome, ProviderResponse)
    outcome = result.outcome
    assert (outcome.prompt_tokens, outcome.completion_tokens, outcome.cached_tokens) == (
        36, 87, 4)
    assert outcome.body is response  # stored as the provider wrote it
