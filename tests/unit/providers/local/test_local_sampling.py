"""A local line's sampling fields: what vLLM is given, and the 400 naming a field the
engine does not apply (never a silent drop). Engine-free: a fake tokenizer."""

from typing import Any

import pytest

from quotaflow.constants import ENDPOINT_CHAT, ENDPOINT_COMPLETIONS
from quotaflow.deployments.deployment import Deployment
from quotaflow.errors import PermanentProviderError
from quotaflow.providers.local.requests import GenerationRequest, parts_for
from quotaflow.providers.local.sampling import VLLM_APPLIES


class FakeEngine:
    max_context = 4096
    takes_images = False

    def __init__(self, applies: frozenset[str]) -> None:
        self.applies = applies

    def chat_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        return [1, 2, 3]

    def text_ids(self, text: str) -> list[int]:
        return [1, 2]


def deployment(engine: str) -> Deployment:
    return Deployment(name="local-one", provider="local", engine=engine, model="tiny",
                      model_path="/models/tiny", rpm=10, tpm=1000)


def request(engine: str, applies: frozenset[str], url: str = ENDPOINT_CHAT,
            **fields: Any) -> GenerationRequest:
    body = {"model": "tiny", "max_tokens": 8, **fields}
    if url == ENDPOINT_CHAT:
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "hi"
    (part,) = parts_for(url, body, FakeEngine(applies), deployment(engine))
    return part.payload


def refusal(engine: str, applies: frozenset[str], param: str | None = None,
            url: str = ENDPOINT_CHAT, **fields: Any) -> str:
    with pytest.raises(PermanentProviderError) as caught:
        request(engine, applies, url, **fields)
    assert caught.value.status_code == 400
    if param is not None:  # the field is named where API clients look for it
        assert caught.value.body["error"]["param"] == param
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


def test_vllm_is_given_choices_logprobs_and_its_own_sampling_extras() -> None:
    got = request("vllm", VLLM_APPLIES, n=3, logprobs=True, top_logprobs=5,
                  repetition_penalty=1.2, top_k=40, min_p=0.05)
    assert (got.n, got.logprobs, got.repetition_penalty, got.top_k, got.min_p) == (
        3, 5, 1.2, 40, 0.05)
    # chat: logprobs alone asks for the chosen tokens' only; completions: logprobs is N
    assert request("vllm", VLLM_APPLIES, logprobs=True).logprobs == 0
    assert request("vllm", VLLM_APPLIES, ENDPOINT_COMPLETIONS, logprobs=2).logprobs == 2
    assert request("vllm", VLLM_APPLIES, ENDPOINT_COMPLETIONS, logprobs=0).logprobs == 0
    # neutral values ask for nothing, on any engine
    plain = request("transformers", frozenset(), n=1, repetition_penalty=1.0, top_k=-1,
                    min_p=0, logprobs=None, top_logprobs=None)
    assert (plain.n, plain.logprobs, plain.repetition_penalty) == (1, None, 1.0)


def test_defaults_and_fields_that_do_not_change_the_answer_pass_everywhere() -> None:
    got = request("transformers", frozenset(), stop=None, seed=None, logprobs=False,
                  response_format={"type": "text"}, user="u-1", metadata={"k": "v"},
                  store=False, parallel_tool_calls=True, tools=[])
    assert (got.stop, got.seed, got.structured) == ((), None, None)


@pytest.mark.parametrize("field,value", [
    ("stop", ["END"]), ("seed", 3), ("presence_penalty", 1.0), ("frequency_penalty", 0.2),
    ("logit_bias", {"1": 5}), ("response_format", {"type": "json_object"}), ("n", 2),
    ("logprobs", True), ("top_logprobs", 3), ("repetition_penalty", 1.3), ("top_k", 5),
    ("min_p", 0.1)])
def test_the_transformers_engine_refuses_what_it_does_not_apply_by_name(
        field: str, value: Any) -> None:
    message = refusal("transformers", frozenset(), field, **{field: value})
    assert f"'{field}' is not applied by the transformers engine" in message
    assert "engine = 'vllm'" in message


@pytest.mark.parametrize("field,value", [
    ("tools", [{"type": "function", "function": {"name": "f"}}]), ("tool_choice", "required"),
    ("audio", {"voice": "alloy"})])
def test_no_local_engine_takes_tools_or_audio_out(field: str, value: Any) -> None:
    message = refusal("vllm", VLLM_APPLIES, field, **{field: value})
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
    ({"response_format": {"type": "xml"}}, "type 'xml' is not one of"),
    ({"n": 0}, "'n' must be an integer from 1 to 128"),
    ({"n": 2.0}, "'n' must be an integer"),
    ({"top_logprobs": 3}, "'top_logprobs' needs 'logprobs': true"),
    ({"logprobs": True, "top_logprobs": 21}, "'top_logprobs' must be an integer from 0 to 20"),
    ({"repetition_penalty": 0}, "'repetition_penalty' must be a number from 0.01 to 10"),
    ({"min_p": 2}, "'min_p' must be a number from 0 to 1")])
def test_bad_values_are_refused_with_the_reason(fields: dict[str, Any], reason: str) -> None:
    assert reason in refusal("vllm", VLLM_APPLIES, **fields)


def test_completions_take_logprobs_as_a_count() -> None:
    assert "'logprobs' must be an integer from 0 to 20" in refusal(
        "vllm", VLLM_APPLIES, "logprobs", ENDPOINT_COMPLETIONS, logprobs=True)
    assert "'top_logprobs' is a chat field" in refusal(
        "vllm", VLLM_APPLIES, "top_logprobs", ENDPOINT_COMPLETIONS, logprobs=1, top_logprobs=1)
