"""A Bedrock Converse answer as an Anthropic Message, the shape quotaflow makes over.

Every Bedrock answer is handed up as a Message (`answer_format` "anthropic"): an
InvokeModel answer for an Anthropic model already is one, a Converse answer is made one
here, and the job's OpenAI output is then made from it as from any Message
(anthropic_answers.py), so one mapping serves both output shapes. Text, tool calls and
reasoning (with its signature, which a later turn sends back) are kept; Converse's
usage counts input tokens apart from cache reads and writes, as Anthropic's does.
"""

from typing import Any

# Converse's stopReason -> Anthropic's stop_reason (guardrails and content filters end
# the answer as a refusal would; an answer Bedrock could not parse ends as end_turn).
STOP_REASONS = {"end_turn": "end_turn", "tool_use": "tool_use", "max_tokens": "max_tokens",
                "stop_sequence": "stop_sequence", "guardrail_intervened": "refusal",
                "content_filtered": "refusal",
                "model_context_window_exceeded": "model_context_window_exceeded"}


def message_from_converse(answer: dict[str, Any], model: str,
                          request_id: str | None) -> dict[str, Any]:
    """The Message carrying a Converse answer; `model` is the deployment's model id
    (Converse answers name none), the id Bedrock's request id."""
    message = (answer.get("output") or {}).get("message") or {}
    content = [block for part in message.get("content") or () if isinstance(part, dict)
               for block in _blocks(part)]
    usage = answer.get("usage") or {}
    return {
        "id": f"msg_bdrk_{request_id}" if request_id else "msg_bdrk",
        "type": "message", "role": "assistant", "model": model, "content": content,
        "stop_reason": STOP_REASONS.get(answer.get("stopReason") or "", "end_turn"),
        "stop_sequence": None,
        "usage": {"input_tokens": int(usage.get("inputTokens") or 0),
                  "output_tokens": int(usage.get("outputTokens") or 0),
                  "cache_creation_input_tokens": int(usage.get("cacheWriteInputTokens") or 0),
                  "cache_read_input_tokens": int(usage.get("cacheReadInputTokens") or 0)},
    }


def _blocks(part: dict[str, Any]) -> list[dict[str, Any]]:
    if "text" in part:
        return [{"type": "text", "text": str(part["text"])}]
    if "toolUse" in part:
        use = part["toolUse"] or {}
        return [{"type": "tool_use", "id": use.get("toolUseId"), "name": use.get("name"),
                 "input": use.get("input") or {}}]
    if "reasoningContent" in part:
        reasoning = part["reasoningContent"] or {}
        if "redactedContent" in reasoning:
            return [{"type": "redacted_thinking", "data": reasoning["redactedContent"]}]
        text = reasoning.get("reasoningText") or {}
        return [{"type": "thinking", "thinking": str(text.get("text", "")),
                 "signature": str(text.get("signature", ""))}]
    if "citationsContent" in part:  # cited text: its text, the citations left out
        return [{"type": "text", "text": "".join(
            str(c.get("text", "")) for c in part["citationsContent"].get("content") or ())}]
    return []  # a block of the request's own kinds (a cachePoint) never answers
