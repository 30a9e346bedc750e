"""What an OpenAI-compatible server's answer to a batch line must look like, judged from
the line itself, so the same checks hold for any set of lines (tests/cluster/test_vllm_server.py's
own, or the shared conformance set's): the output line's shape, the answer's object and
its choices, usage as the server counted it, and what the request asked of the reply
(n, max_tokens, stop sequences, a JSON schema, a named tool).
"""

import json
from typing import Any

from quotaflow.constants import ENDPOINT_CHAT, ENDPOINT_COMPLETIONS

ENDPOINT_RESPONSES = "/v1/responses"
OBJECTS = {ENDPOINT_CHAT: "chat.completion", ENDPOINT_COMPLETIONS: "text_completion",
           ENDPOINT_RESPONSES: "response"}


def check_answered(line: dict[str, Any], out: dict[str, Any], model: str) -> tuple[int, int]:
    """Assert `out` is a good output line for `line`; its usage (input, output tokens)."""
    assert out["custom_id"] == line["custom_id"], out
    assert out["error"] is None, out
    response = out["response"]
    assert response["status_code"] == 200, out
    body, request = response["body"], line["body"]
    assert body["object"] == OBJECTS[line["url"]], body
    assert body["model"] == model, body
    if line["url"] == ENDPOINT_RESPONSES:
        return _response(request, body)
    usage = body["usage"]
    prompt, completion = usage["prompt_tokens"], usage["completion_tokens"]
    assert prompt > 0 and completion > 0 and usage["total_tokens"] == prompt + completion, usage
    choices = body["choices"]
    assert [c["index"] for c in choices] == list(range(_choices(line["url"], request))), body
    if (ceiling := request.get("max_completion_tokens") or request.get("max_tokens")):
        assert completion <= ceiling * len(choices), (ceiling, usage)
    for choice in choices:
        assert choice["finish_reason"] in ("stop", "length", "tool_calls"), choice
        if line["url"] == ENDPOINT_CHAT:
            _chat_choice(request, choice)
        else:
            _no_stop_sequence(request, choice["text"])
    return prompt, completion


def _choices(url: str, request: dict[str, Any]) -> int:
    prompts = request["prompt"] if url == ENDPOINT_COMPLETIONS else None
    many = len(prompts) if isinstance(prompts, list) and not isinstance(prompts[0], int) else 1
    return request.get("n", 1) * many


def _chat_choice(request: dict[str, Any], choice: dict[str, Any]) -> None:
    message = choice["message"]
    assert message["role"] == "assistant", message
    content = message.get("content") or ""
    _no_stop_sequence(request, content)
    schema = (request.get("response_format") or {}).get("json_schema")
    if schema and choice["finish_reason"] == "stop":
        value = json.loads(content)  # the schema held the reply to JSON
        required = schema["schema"].get("required", [])
        assert isinstance(value, dict) and set(required) <= set(value), content
    tool_choice = request.get("tool_choice")
    if isinstance(tool_choice, dict) and choice["finish_reason"] != "length":
        calls = message["tool_calls"]
        assert [c["function"]["name"] for c in calls] == [tool_choice["function"]["name"]]
        assert isinstance(json.loads(calls[0]["function"]["arguments"]), dict), calls


def _no_stop_sequence(request: dict[str, Any], text: str) -> None:
    stop = request.get("stop") or []
    for sequence in [stop] if isinstance(stop, str) else stop:
        assert sequence not in text, (sequence, text)


def _response(request: dict[str, Any], body: dict[str, Any]) -> tuple[int, int]:
    """A Responses API answer: a message with output text, input and output tokens."""
    assert body["status"] in ("completed", "incomplete"), body
    texts = [part["text"] for item in body["output"] if item["type"] == "message"
             for part in item["content"] if part["type"] == "output_text"]
    usage = body["usage"]
    tokens_in, tokens_out = usage["input_tokens"], usage["output_tokens"]
    # A random-weight model may say EOS first (an answer of one token and no text), or
    # only tokens that decode to no text (special tokens, skipped), for which vLLM gives
    # no message item at all; a message item given must carry its text.
    messages = [item for item in body["output"] if item["type"] == "message"]
    assert texts or tokens_out == 1 or not messages, body
    assert tokens_in > 0 and tokens_out > 0, usage
    assert usage["total_tokens"] == tokens_in + tokens_out, usage
    if (ceiling := request.get("max_output_tokens")):
        assert tokens_out <= ceiling, usage
    return tokens_in, tokens_out


def check_refused(out: dict[str, Any], status: int, message: str) -> None:
    """A line the server refused: failed, its error naming the server's status and message,
    and its response the server's own answer (status and error body), as OpenAI's error
    file has it."""
    error, response = out["error"], out["response"]
    assert error is not None and error["code"] == "provider_error", out
    assert f"HTTP {status}" in error["message"] and message in error["message"], out
    assert response["status_code"] == status, out
    assert message in response["body"]["error"]["message"], out
