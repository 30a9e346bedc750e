"""A GenerationRequest as vLLM's prompt and SamplingParams keywords, and vLLM's finished
output as our Generated.

vLLM-free: vllm_engine.py hands vLLM's classes and outputs in, so what a line asks of
vLLM is unit-tested without vLLM (tests/unit/providers/local/test_vllm_request.py); the engine only
calls `SamplingParams(**sampling_kwargs(...))` and `TokensPrompt(**prompt_kwargs(...))`.
Fields left at their neutral value are not passed, so vLLM's own defaults (which moved
between versions: top_k's "all tokens" was -1, then 0) stay its own.
"""

from collections.abc import Sequence
from types import ModuleType
from typing import Any

from quotaflow.providers.local.requests import Generated, GenerationRequest, TokenLogprob


def structured_option(sampling_params: ModuleType | Any) -> tuple[str, Any]:
    """SamplingParams' structured-output field and its class in the installed vLLM:
    `structured_outputs` / StructuredOutputsParams since 0.11, `guided_decoding` /
    GuidedDecodingParams before (the same keywords: json, json_object, regex, ...)."""
    found = getattr(sampling_params, "StructuredOutputsParams", None)
    if found is not None:
        return "structured_outputs", found
    return "guided_decoding", sampling_params.GuidedDecodingParams


def sampling_kwargs(request: GenerationRequest,
                    structured: tuple[str, Any] | None = None) -> dict[str, Any]:
    """vLLM's SamplingParams keywords for the request (structured: structured_option's
    answer, needed when the request asks for a response_format)."""
    kwargs: dict[str, Any] = {"max_tokens": request.max_new_tokens,
                              "temperature": request.temperature, "top_p": request.top_p}
    optional: dict[str, Any] = {
        "n": request.n if request.n != 1 else None,
        "stop": list(request.stop) or None,
        "seed": request.seed,
        "presence_penalty": request.presence_penalty or None,
        "frequency_penalty": request.frequency_penalty or None,
        "repetition_penalty": (request.repetition_penalty
                               if request.repetition_penalty != 1.0 else None),
        "top_k": request.top_k or None,
        "min_p": request.min_p or None,
        "logit_bias": request.logit_bias,
        "logprobs": request.logprobs,
    }
    kwargs.update({k: v for k, v in optional.items() if v is not None})
    if request.structured:
        if structured is None:
            raise ValueError("a response_format needs vLLM's structured-output class")
        field, params = structured
        kwargs[field] = params(**request.structured)
    return kwargs


def prompt_kwargs(request: GenerationRequest, images: Sequence[Any] = ()) -> dict[str, Any]:
    """vLLM's TokensPrompt keywords: the ids, and the loaded images as its multimodal data
    (each placed where the chat template wrote the model's image token)."""
    kwargs: dict[str, Any] = {"prompt_token_ids": request.input_ids}
    if images:
        kwargs["multi_modal_data"] = {"image": list(images)}
    return kwargs


def generated_from(output: Any, request: GenerationRequest) -> list[Generated]:
    """A finished RequestOutput's choices (one, or `n`); vLLM's Logprob maps (token id ->
    logprob, rank, decoded_token) become TokenLogprob where the line asked."""
    prompt_ids = getattr(output, "prompt_token_ids", None)
    prompt_tokens = len(prompt_ids) if request.images and prompt_ids else None
    choices = []
    for completion in sorted(output.outputs, key=lambda c: c.index):
        reason = "length" if completion.finish_reason == "length" else "stop"
        logprobs = None
        if request.logprobs is not None:
            steps = completion.logprobs or []
            logprobs = tuple(_token_logprob(token, step, request.logprobs)
                             for token, step in zip(completion.token_ids, steps, strict=False))
        choices.append(Generated(len(completion.token_ids), completion.text, reason, logprobs,
                                 prompt_tokens))
    return choices


def _token_logprob(token: int, step: dict[int, Any], top: int) -> TokenLogprob:
    chosen = step[token]
    ranked = sorted(step.values(), key=lambda lp: -lp.logprob)[:top]
    return TokenLogprob(chosen.decoded_token or "", float(chosen.logprob),
                        tuple((lp.decoded_token or "", float(lp.logprob)) for lp in ranked))
