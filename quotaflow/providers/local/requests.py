"""OpenAI request bodies in, engine work items out; engine answers in, OpenAI bodies out.

Torch-free: the engine is reached through the small Tokenizer protocol, so
the translation is the same for every engine. Usage is counted from the real
token ids: prompt_tokens is the prompt as the model sees it (chat template
included), completion_tokens every generated token up to and including EOS,
or max_tokens when the reply was cut.
"""

import time
import uuid
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from quotaflow.budget.tokens import max_output_tokens
from quotaflow.constants import ENDPOINT_CHAT, ENDPOINT_COMPLETIONS, ENDPOINT_EMBEDDINGS
from quotaflow.deployments.catalog import Deployment
from quotaflow.providers.local.sampling import bad_request, extra_sampling

GENERATE = "generate"
EMBED = "embed"
FINGERPRINT = "quotaflow-local"


class Tokenizer(Protocol):
    """What the translation needs of an engine."""

    max_context: int | None
    # The sampling fields beyond temperature and top_p it applies (sampling.py).
    applies: frozenset[str]

    def chat_ids(self, messages: list[dict[str, Any]]) -> list[int]: ...

    def text_ids(self, text: str) -> list[int]: ...


class Engine(Tokenizer, Protocol):
    """A loaded model: tokenizes requests, and runs a batch of one kind of work."""

    def run_batch(self, kind: Hashable, payloads: Sequence[Any]) -> list[Any]: ...


@dataclass(frozen=True)
class GenerationRequest:
    """One sequence to continue, with its own limit and sampling (the fields after top_p
    only where the engine applies them: sampling.py refuses them elsewhere)."""

    input_ids: list[int]
    max_new_tokens: int
    temperature: float  # 0: greedy
    top_p: float
    stop: tuple[str, ...] = ()
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None
    structured: dict[str, Any] | None = None  # vLLM's StructuredOutputsParams keywords


@dataclass(frozen=True)
class Generated:
    """A finished sequence: its counted tokens, its text, and why it stopped."""

    completion_tokens: int
    text: str
    finish_reason: str  # "stop" (EOS) or "length" (max_tokens)


@dataclass(frozen=True)
class Part:
    """One unit of batcher work; an embeddings request with several inputs has several."""

    kind: str
    prompt_tokens: int
    max_new_tokens: int
    payload: Any


def parts_for(url: str, body: dict[str, Any], engine: Tokenizer,
              deployment: Deployment) -> list[Part]:
    """The batcher work for one request; refuses what the engine cannot do (HTTP 400)."""
    if url == ENDPOINT_EMBEDDINGS:
        inputs = body.get("input")
        texts = [inputs] if isinstance(inputs, str) else inputs
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise bad_request("input must be a string or a non-empty list of strings")
        return [_checked(Part(EMBED, len(ids), 0, ids), engine)
                for ids in (engine.text_ids(text) for text in texts)]
    if (body.get("n") or 1) != 1:
        raise bad_request("the local engine answers n = 1 only")
    if url == ENDPOINT_CHAT:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise bad_request("messages must be a non-empty list")
        ids = engine.chat_ids([_flat(m) for m in messages])
    elif url == ENDPOINT_COMPLETIONS:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise bad_request("prompt must be a string (one prompt per request)")
        ids = engine.text_ids(prompt)
    else:
        raise bad_request(f"the local engine does not serve {url}")
    extra = extra_sampling(body, deployment.engine, engine.applies)
    limit = max_output_tokens(body, deployment.default_max_tokens)
    temperature = body.get("temperature")
    top_p = body.get("top_p")
    request = GenerationRequest(
        ids, limit,
        float(deployment.default_temperature if temperature is None else temperature),
        float(deployment.default_top_p if top_p is None else top_p), **extra)
    return [_checked(Part(GENERATE, len(ids), limit, request), engine)]


def _flat(message: dict[str, Any]) -> dict[str, Any]:
    """A message whose content is a list of parts, as its text: chat templates want strings."""
    content = message.get("content")
    if isinstance(content, list):
        text = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        return {**message, "content": text}
    return message


def _checked(part: Part, engine: Tokenizer) -> Part:
    if not part.prompt_tokens:
        raise bad_request("the prompt is empty")
    needed = part.prompt_tokens + part.max_new_tokens
    if engine.max_context is not None and needed > engine.max_context:
        raise bad_request(
            f"{part.prompt_tokens} prompt tokens + max_tokens {part.max_new_tokens} exceed the "
            f"model's context of {engine.max_context} tokens; shorten the prompt or lower "
            "max_tokens")
    return part


def answer_body(url: str, deployment: Deployment, parts: list[Part],
                answers: list[Any]) -> dict[str, Any]:
    """The OpenAI-shaped body: embedding list, text_completion or chat.completion."""
    prompt_tokens = sum(p.prompt_tokens for p in parts)
    if url == ENDPOINT_EMBEDDINGS:
        return {
            "object": "list",
            "model": deployment.model,
            "data": [{"object": "embedding", "index": i, "embedding": vector}
                     for i, vector in enumerate(answers)],
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
        }
    (generated,) = answers
    if url == ENDPOINT_COMPLETIONS:
        choice: dict[str, Any] = {"index": 0, "text": generated.text,
                                  "finish_reason": generated.finish_reason, "logprobs": None}
        kind, prefix = "text_completion", "cmpl"
    else:
        choice = {"index": 0, "message": {"role": "assistant", "content": generated.text},
                  "finish_reason": generated.finish_reason}
        kind, prefix = "chat.completion", "chatcmpl"
    return {
        "id": f"{prefix}-{uuid.uuid4().hex[:24]}",
        "object": kind,
        "created": int(time.time()),
        "model": deployment.model,
        "system_fingerprint": f"{FINGERPRINT}-{deployment.engine}",
        "choices": [choice],
        "usage": {"prompt_tokens": prompt_tokens,
                  "completion_tokens": generated.completion_tokens,
                  "total_tokens": prompt_tokens + generated.completion_tokens},
    }
