"""Content shapes each API takes, so the strict mock refuses a request in the other
family's shape with the 400 the real API would answer (an OpenAI `image_url` part sent
to /v1/messages, an Anthropic `tool_use` block sent to /v1/chat/completions): a
translation that forgot a field fails the line visibly instead of passing unnoticed."""

from typing import Any

# The content block types Anthropic's Messages API defines for request messages.
ANTHROPIC_BLOCKS = frozenset({
    "text", "image", "document", "search_result", "tool_use", "tool_result", "thinking",
    "redacted_thinking", "server_tool_use", "web_search_tool_result", "web_fetch_tool_result",
    "code_execution_tool_result", "bash_code_execution_tool_result",
    "text_editor_code_execution_tool_result", "tool_search_tool_result", "container_upload",
    "tool_reference"})
# OpenAI chat content part types, and the fields a chat message may carry.
OPENAI_PARTS = frozenset({"text", "image_url", "input_audio", "file", "refusal"})
OPENAI_MESSAGE_KEYS = frozenset({"role", "content", "name", "tool_calls", "tool_call_id",
                                 "refusal", "audio", "function_call", "reasoning_content"})
# Anthropic-only top-level fields an OpenAI-compatible server does not know.
ANTHROPIC_ONLY = frozenset({"system", "stop_sequences", "thinking", "output_config",
                            "cache_control", "max_tokens_to_sample", "_anthropic_params"})


def messages_problem(body: dict[str, Any]) -> str | None:
    """Why /v1/messages would refuse these messages' or system's blocks, or None."""
    system = body.get("system")
    if isinstance(system, list) and any(
            not isinstance(b, dict) or b.get("type") != "text" for b in system):
        return "system: a list of text blocks is required"
    for i, message in enumerate(body["messages"]):
        content = message.get("content")
        if isinstance(content, str):
            continue
        if not isinstance(content, list):
            return f"messages.{i}.content: a string or a list of blocks is required"
        for j, block in enumerate(content):
            kind = block.get("type") if isinstance(block, dict) else None
            if kind not in ANTHROPIC_BLOCKS:
                return f"messages.{i}.content.{j}.type: {kind!r} is not a valid block type"
    return None


def chat_problem(body: dict[str, Any]) -> str | None:
    """Why an OpenAI-compatible /v1/chat/completions would refuse this body, or None."""
    for key in ANTHROPIC_ONLY & set(body):
        return f"Unrecognized request argument supplied: {key}"
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None  # counted (and refused) by the judge as before
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            continue
        extra = sorted(set(message) - OPENAI_MESSAGE_KEYS)
        if extra:
            return f"messages[{i}].{extra[0]}: Unrecognized field"
        content = message.get("content")
        if isinstance(content, list):
            for j, part in enumerate(content):
                kind = part.get("type") if isinstance(part, dict) else None
                if kind not in OPENAI_PARTS:
                    return f"messages[{i}].content[{j}].type: invalid value {kind!r}"
    return None
