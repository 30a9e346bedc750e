"""OpenAI request bodies in, engine work items out (answers.py makes the way back).

Torch-free: the engine is reached through the small Tokenizer protocol, so
the translation is the same for every engine. Usage is counted from the real
token ids: prompt_tokens is the prompt as the model sees it (chat template
included), completion_tokens every generated token up to and including EOS,
or max_tokens when the reply was cut.
"""

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from quotaflow.budget.tokens import max_output_tokens
from quotaflow.constants import ENDPOINT_CHAT, ENDPOINT_COMPLETIONS, ENDPOINT_EMBEDDINGS
from quotaflow.deployments.deployment import Deployment
from quotaflow.providers.local.adapters import adapter_for
from quotaflow.providers.local.content import ImageRef, template_messages
from quotaflow.providers.local.sampling import bad_request, extra_sampling

GENERATE = "generate"
EMBED = "embed"


class Tokenizer(Protocol):
    """What the translation needs of an engine."""

    max_context: int | None
    # The sampling fields beyond temperature and top_p it applies (sampling.py).
    applies: frozenset[str]
    # Whether its model takes image parts (content.py); a part it cannot take fails.
    takes_images: bool

    def chat_ids(self, messages: list[dict[str, Any]]) -> list[int]: ...

    def text_ids(self, text: str) -> list[int]: ...


class Engine(Tokenizer, Protocol):
    """A loaded model: tokenizes requests, and runs a batch of one kind of work."""

    def run_batch(self, kind: Hashable, payloads: Sequence[Any]) -> list[Any]: ...

    def close(self) -> None:
        """End what the engine started (processes, threads); it takes no request after."""


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
    n: int = 1
    logprobs: int | None = None  # top tokens reported beside each chosen one; None: none
    repetition_penalty: float = 1.0
    top_k: int = 0  # 0: all tokens
    min_p: float = 0.0
    images: tuple[ImageRef, ...] = ()  # in the order the prompt places them


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log probability, and the most likely tokens at its step."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Generated:
    """A finished sequence: its counted tokens, its text, and why it stopped."""

    completion_tokens: int
    text: str
    finish_reason: str  # "stop" (EOS) or "length" (max_tokens)
    logprobs: tuple[TokenLogprob, ...] | None = None  # where the line asked for them
    # The prompt as the engine counted it, where that differs from the request's ids (an
    # image's placeholder grows into the image's tokens inside vLLM).
    prompt_tokens: int | None = None


@dataclass(frozen=True)
class Part:
    """One unit of batcher work; an embeddings request with several inputs has several."""

    kind: str
    prompt_tokens: int
    max_new_tokens: int
    payload: Any
    adapter: str | None = None  # the LoRA adapter its line's model names; None: base


def batch_kind(part: Part) -> Hashable:
    """What the batcher groups by: the work's kind, and its adapter where it has one (a
    model batch of the transformers engine runs with one adapter, or none)."""
    return part.kind if part.adapter is None else (part.kind, part.adapter)


def split_kind(kind: Hashable) -> tuple[Hashable, str | None]:
    """batch_kind's answer as (kind, adapter)."""
    if isinstance(kind, tuple):
        return kind[0], kind[1]
    return kind, None


def parts_for(url: str, body: dict[str, Any], engine: Tokenizer,
              deployment: Deployment) -> list[Part]:
    """The batcher work for one request; refuses what the engine cannot do (HTTP 400)."""
    adapter = adapter_for(body, deployment)
    if url == ENDPOINT_EMBEDDINGS:
        inputs = body.get("input")
        texts = [inputs] if isinstance(inputs, str) else inputs
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise bad_request("input must be a string or a non-empty list of strings")
        return [_checked(Part(EMBED, len(ids), 0, ids, adapter), engine)
                for ids in (engine.text_ids(text) for text in texts)]
    images: tuple[ImageRef, ...] = ()
    if url == ENDPOINT_CHAT:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise bad_request("messages must be a non-empty list", "messages")
        templated = template_messages(messages, deployment.name, engine.takes_images)
        ids, images = engine.chat_ids(templated.messages), templated.images
    elif url == ENDPOINT_COMPLETIONS:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise bad_request("prompt must be a string (one prompt per request)")
        ids = engine.text_ids(prompt)
    else:
        raise bad_request(f"the local engine does not serve {url}")
    extra = extra_sampling(body, url, deployment.engine, engine.applies)
    limit = max_output_tokens(body, deployment.default_max_tokens)
    temperature = body.get("temperature")
    top_p = body.get("top_p")
    request = GenerationRequest(
        ids, limit,
        float(deployment.default_temperature if temperature is None else temperature),
        float(deployment.default_top_p if top_p is None else top_p), images=images, **extra)
    return [_checked(Part(GENERATE, len(ids), limit, request, adapter), engine)]


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
