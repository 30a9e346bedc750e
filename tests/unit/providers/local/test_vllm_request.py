"""What a line asks of vLLM: the SamplingParams and TokensPrompt keywords built from it, and
vLLM's finished output (choices, log probabilities) as OpenAI answers. vLLM-free: vLLM's
classes and outputs are stood in for by plain objects of the same shape."""

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from quotaflow.constants import ENDPOINT_CHAT, ENDPOINT_COMPLETIONS
from quotaflow.deployments.deployment import Deployment
from quotaflow.providers.local.answers import answer_body
from quotaflow.providers.local.content import ImageRef
from quotaflow.providers.local.requests import GENERATE, GenerationRequest, Part
from quotaflow.providers.local.vllm_request import (
    generated_from,
    prompt_kwargs,
    sampling_kwargs,
    structured_option,
)


@dataclass
class StructuredOutputsParams:  # vLLM >= 0.11's, by its keywords
    json: Any = None
    json_object: bool | None = None


@dataclass
class GuidedDecodingParams:  # vLLM < 0.11's
    json: Any = None
    json_object: bool | None = None


@dataclass
class Logprob:  # vllm.logprobs.Logprob
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:  # vllm.outputs.CompletionOutput
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    logprobs: list[dict[int, Logprob]] | None = None


@dataclass
class RequestOutput:
    outputs: list[CompletionOutput]
    prompt_token_ids: list[int] = field(default_factory=lambda: [1, 2, 3])


DEPLOYMENT = Deployment(name="v", provider="local", engine="vllm", model="tiny",
                        model_path="/models/tiny", rpm=10, tpm=1000)
NEW = SimpleNamespace(StructuredOutputsParams=StructuredOutputsParams,
                      GuidedDecodingParams=GuidedDecodingParams)
OLD = SimpleNamespace(GuidedDecodingParams=GuidedDecodingParams)


def request(**fields: Any) -> GenerationRequest:
    return GenerationRequest([5, 6, 7], 16, 0.7, 0.9, **fields)


def test_a_plain_request_leaves_everything_else_to_vllms_defaults() -> None:
    assert sampling_kwargs(request()) == {"max_tokens": 16, "temperature": 0.7, "top_p": 0.9}


def test_every_field_a_line_asks_for_is_passed() -> None:
    schema = {"type": "object"}
    got = sampling_kwargs(request(
        stop=("\n", "END"), seed=7, presence_penalty=0.5, frequency_penalty=-1.0,
        logit_bias={50: -100.0}, structured={"json": schema}, n=3, logprobs=2,
        repetition_penalty=1.2, top_k=40, min_p=0.05), structured_option(NEW))
    assert got == {"max_tokens": 16, "temperature": 0.7, "top_p": 0.9, "n": 3,
                   "stop": ["\n", "END"], "seed": 7, "presence_penalty": 0.5,
                   "frequency_penalty": -1.0, "repetition_penalty": 1.2, "top_k": 40,
                   "min_p": 0.05, "logit_bias": {50: -100.0}, "logprobs": 2,
                   "structured_outputs": StructuredOutputsParams(json=schema)}
    # logprobs 0 (the chosen tokens' only) and seed 0 are asked for, not defaults
    assert sampling_kwargs(request(logprobs=0, seed=0))["logprobs"] == 0
    assert sampling_kwargs(request(logprobs=0, seed=0))["seed"] == 0


def test_structured_output_goes_where_the_installed_vllm_takes_it() -> None:
    wanted = request(structured={"json_object": True})
    assert sampling_kwargs(wanted, structured_option(NEW))["structured_outputs"] == (
        StructuredOutputsParams(json_object=True))
    assert sampling_kwargs(wanted, structured_option(OLD))["guided_decoding"] == (
        GuidedDecodingParams(json_object=True))
    with pytest.raises(ValueError, match="structured-output class"):
        sampling_kwargs(wanted)


def test_images_go_as_vllms_multimodal_data() -> None:
    assert prompt_kwargs(request()) == {"prompt_token_ids": [5, 6, 7]}
    assert prompt_kwargs(request(), ["img-a", "img-b"]) == {
        "prompt_token_ids": [5, 6, 7], "multi_modal_data": {"image": ["img-a", "img-b"]}}


def step(chosen: int, *others: tuple[int, float], chosen_logprob: float = -0.1,
         names: dict[int, str] | None = None) -> dict[int, Logprob]:
    names = names or {}
    found = {chosen: Logprob(chosen_logprob, None, names.get(chosen, f"t{chosen}"))}
    for token, logprob in others:
        found[token] = Logprob(logprob, None, names.get(token, f"t{token}"))
    return found


def test_choices_and_their_logprobs_become_openai_chat_answers() -> None:
    # Given vLLM's output of two choices with logprobs (top 2) for each token
    output = RequestOutput([
        CompletionOutput(1, "b", [9], "length", [step(9, (4, -0.5), (8, -3.0),
                                                      chosen_logprob=-1.0)]),
        CompletionOutput(0, "Hi!", [4, 2], "stop", [step(4, (9, -2.0)),
                                                  step(2, (3, -4.0), (5, -5.0))]),
    ])
    asked = request(n=2, logprobs=2)
    # When it is read back and answered
    choices = generated_from(output, asked)
    parts = [Part(GENERATE, 3, 16, asked)]
    body = answer_body(ENDPOINT_CHAT, DEPLOYMENT, parts, [choices])
    # Then each choice is there, by its index, usage counting both
    assert [c["message"]["content"] for c in body["choices"]] == ["Hi!", "b"]
    assert [c["finish_reason"] for c in body["choices"]] == ["stop", "length"]
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
    # And each token's logprob with the most likely tokens at its step, likeliest first
    first = body["choices"][0]["logprobs"]["content"][0]
    assert first == {"token": "t4", "logprob": -0.1, "bytes": list(b"t4"),
                     "top_logprobs": [
                         {"token": "t4", "logprob": -0.1, "bytes": list(b"t4")},
                         {"token": "t9", "logprob": -2.0, "bytes": list(b"t9")}]}
    # a chosen token outside the top 2 is reported, but not among them
    other = body["choices"][1]["logprobs"]["content"][0]
    assert other["logprob"] == -1.0
    assert [t["token"] for t in other["top_logprobs"]] == ["t4", "t9"]


def test_completions_logprobs_take_the_legacy_shape() -> None:
    names = {4: "Hel", 2: "lo"}
    output = RequestOutput([CompletionOutput(0, "Hello", [4, 2], "stop", [
        step(4, (7, -1.5), names=names), step(2, chosen_logprob=-0.2, names=names)])])
    asked = request(logprobs=1)
    body = answer_body(ENDPOINT_COMPLETIONS, DEPLOYMENT, [Part(GENERATE, 3, 16, asked)],
                       [generated_from(output, asked)])
    assert body["choices"][0]["logprobs"] == {
        "tokens": ["Hel", "lo"], "token_logprobs": [-0.1, -0.2],
        "top_logprobs": [{"Hel": -0.1}, {"lo": -0.2}], "text_offset": [0, 3]}


def test_no_logprobs_unless_asked_and_an_images_prompt_counts_vllms_tokens() -> None:
    output = RequestOutput([CompletionOutput(0, "red", [4], "stop")],
                           prompt_token_ids=list(range(40)))
    (plain,) = generated_from(output, request())
    assert plain.logprobs is None and plain.prompt_tokens is None
    # The image placeholder grew into the image's tokens inside vLLM: usage says so
    with_image = request(images=(ImageRef("data:image/png;base64,AA", "m"),))
    body = answer_body(ENDPOINT_CHAT, DEPLOYMENT, [Part(GENERATE, 3, 16, with_image)],
                       [generated_from(output, with_image)])
    assert body["usage"]["prompt_tokens"] == 40
    assert "logprobs" not in body["choices"][0]
