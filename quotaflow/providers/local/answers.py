"""Engine answers as OpenAI bodies: an embedding list, a text_completion, a chat.completion.

A generation request's answer is one Generated, or a list of them where the line asked
for `n` choices (vLLM); usage counts every choice's tokens, as OpenAI's does. Log
probabilities take each endpoint's own shape: chat's `logprobs.content` entries, the
legacy completions' parallel `tokens` / `token_logprobs` / `top_logprobs` lists.
"""

import time
import uuid
from typing import Any

from quotaflow.constants import ENDPOINT_COMPLETIONS, ENDPOINT_EMBEDDINGS
from quotaflow.deployments.deployment import Deployment
from quotaflow.providers.local.requests import Generated, Part, TokenLogprob

FINGERPRINT = "quotaflow-local"


def answer_body(url: str, deployment: Deployment, parts: list[Part],
                answers: list[Any]) -> dict[str, Any]:
    """The OpenAI-shaped body for a request's parts and their answers; its `model` is the
    adapter's name where the line ran with one, as vLLM's server answers."""
    prompt_tokens = sum(p.prompt_tokens for p in parts)
    model = parts[0].adapter or deployment.model
    if url == ENDPOINT_EMBEDDINGS:
        return {
            "object": "list",
            "model": model,
            "data": [{"object": "embedding", "index": i, "embedding": vector}
                     for i, vector in enumerate(answers)],
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
        }
    (answer,) = answers
    generated: list[Generated] = answer if isinstance(answer, list) else [answer]
    if generated[0].prompt_tokens is not None:
        prompt_tokens = generated[0].prompt_tokens
    completion_tokens = sum(g.completion_tokens for g in generated)
    if url == ENDPOINT_COMPLETIONS:
        choices = [_text_choice(i, g) for i, g in enumerate(generated)]
        kind, prefix = "text_completion", "cmpl"
    else:
        choices = [_chat_choice(i, g) for i, g in enumerate(generated)]
        kind, prefix = "chat.completion", "chatcmpl"
    return {
        "id": f"{prefix}-{uuid.uuid4().hex[:24]}",
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": f"{FINGERPRINT}-{deployment.engine}",
        "choices": choices,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }


def _text_choice(index: int, generated: Generated) -> dict[str, Any]:
    return {"index": index, "text": generated.text, "finish_reason": generated.finish_reason,
            "logprobs": None if generated.logprobs is None else _text_logprobs(
                generated.logprobs)}


def _chat_choice(index: int, generated: Generated) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": index, "message": {"role": "assistant", "content": generated.text},
        "finish_reason": generated.finish_reason}
    if generated.logprobs is not None:
        choice["logprobs"] = {"content": [_chat_entry(t) for t in generated.logprobs],
                              "refusal": None}
    return choice


def _chat_entry(token: TokenLogprob) -> dict[str, Any]:
    return {**_token(token.token, token.logprob),
            "top_logprobs": [_token(text, logprob) for text, logprob in token.top]}


def _token(text: str, logprob: float) -> dict[str, Any]:
    return {"token": text, "logprob": logprob, "bytes": list(text.encode())}


def _text_logprobs(tokens: tuple[TokenLogprob, ...]) -> dict[str, Any]:
    offsets, at = [], 0
    for token in tokens:
        offsets.append(at)
        at += len(token.token)
    return {"tokens": [t.token for t in tokens],
            "token_logprobs": [t.logprob for t in tokens],
            "top_logprobs": [dict(t.top) for t in tokens],
            "text_offset": offsets}
