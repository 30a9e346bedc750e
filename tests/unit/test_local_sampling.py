"""A local line's sampling fields: what vLLM is given, and the 400 naming a field the
engine does not apply (never a silent drop). Engine-free: a fake tokenizer."""

from typing import Any

import pytest

from quotaflow.constants import ENDPOINT_CHAT
from quotaflow.deployments.catalog import Deployment
from quotaflow.errors import PermanentProviderError
from quotaflow.providers.local.requests import GenerationRequest, parts_for
from quotaflow.providers.local.sampling import VLLM_APPLIES


class FakeEngine:
    max_context = 4096

    def __init__(self, applies: frozenset[str]) -> None:
        self.applies = applies

    def chat_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        return [1, 2, 3]

    def text_ids(self, text: str) -> list[int]:
        return [1, 2]


def deployment(engine: str) -> Deployment:
    return Deployment(name="local-one", provider="local", engine=engine, model="tiny",
                      model_path="/models/tiny", rpm=10, tpm=1000)


def request(engine: str, applies: frozenset[str], **fields: Any) -> GenerationRequest:
    body = {"model": "tiny", "max_tokens": 8,
            "messages": [{"role": "user", "content": "hi"}], **fields}
    (part,) = parts_for(ENDPOINT_CHAT, body, FakeEngine(applies), deployment(engine))
    return part.payload


def refusal(engine: str, applies: frozenset[str], **fields: Any) -> str:
    with pytest.raises(PermanentProviderError) as caught:
        request(engine, applies, **fields)
    assert caught.value.status_code == 400
    return str(caught.value)


def test_vllm_is_given_every_sampling_field_as_written() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    got = request("vllm", VLLM_APPLIES, stop=["\n\n", "END"], seed=7, presence_penalty=0.5,
                  frequency_penalty=-1, logit_bias={"50256": -100},
                  response_format={"type": "json_schema",
                                   "json_schema": {"name": "a", "schema": schema}})
    assert (got.stop, got.seed, got.presence_penalty, got.frequency_penalty) == (
        ("\n\n", "END"), 7, 0.5, -1.0)
    assert got.logit_bias == {50256: -100.0}
    assert got.structured == {"json": schema}
    assert request("vllm", VLLM_APPLIES, stop="###").stop == ("###",)
    assert request("vllm", VLLM_APPLIES,
                   response_format={"type": "json_object"}).structured == {"json_object": True}


def test_defaults_and_fields_that_do_not_change_the_answer_pass_everywhere() -> None:
    got = request("transformers", frozenset(), stop=None, seed=None, logprobs=False,
                  response_format={"type": "text"}, user="u-1", metadata={"k": "v"},
                  store=False, parallel_tool_calls=True, tools=[])
    assert (got.stop, got.seed, got.structured) == ((), None, None)


@pytest.mark.parametrize("field,value", [
    ("stop", ["END"]), ("seed", 3), ("presence_penalty", 1.0), ("frequency_penalty", 0.2),
    ("logit_bias", {"1": 5}), ("response_format", {"type": "json_object"})])
def test_the_transformers_engine_refuses_what_it_does_not_apply_by_name(
        field: str, value: Any) -> None:
    message = refusal("transformers", frozenset(), **{field: value})
    assert f"'{field}' is not applied by the transformers engine" in message
    assert "engine = 'vllm'" in message


@pytest.mark.parametrize("field,value", [
    ("tools", [{"type": "function", "function": {"name": "f"}}]), ("tool_choice", "required"),
    ("logprobs", True), ("top_logprobs", 3)])
def test_no_local_engine_takes_tools_or_logprobs(field: str, value: Any) -> None:
    message = refusal("vllm", VLLM_APPLIES, **{field: value})
    assert f"'{field}' is not applied by local engines" in message and "vLLM server" in message


@pytest.mark.parametrize("fields,reason", [
    ({"stop": [""]}, "'stop' must be a string or a list of non-empty strings"),
    ({"stop": 5}, "'stop' must be"),
    ({"seed": "7"}, "'seed' must be an integer"),
    ({"seed": True}, "'seed' must be an integer"),
    ({"presence_penalty": 3}, "'presence_penalty' must be a number from -2 to 2"),
    ({"logit_bias": {"x": 1}}, "'logit_bias' must map token ids to numbers"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a"}}},
     "json_schema needs json_schema.schema"),
    ({"response_format": {"type": "xml"}}, "type 'xml' is not one of")])
def test_bad_values_are_refused_with_the_reason(fields: dict[str, Any], reason: str) -> None:
    assert reason in refusal("vllm", VLLM_APPLIES, **fields)
