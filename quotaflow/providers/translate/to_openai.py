"""An Anthropic line's Messages params as an OpenAI chat body, for an OpenAI-compatible
deployment (provider openai, mock, local, openai-batch).

Done at prepare time, not at ingest: the same line may be routed to an anthropic
deployment, which sends its params as written, so a field only OpenAI cannot take must
fail the line only where it goes to OpenAI. Every top-level field is mapped, dropped
because it cannot change the answer, or refused by name (docs/deployments/anthropic.md).
"""

from typing import Any

from quotaflow.providers.translate import TO_OPENAI, untranslatable
from quotaflow.providers.translate.to_anthropic import EFFORTS
from quotaflow.providers.translate.to_openai_content import convert_messages, system_message, tools

# Fields that cannot change the answer: prompt caching, which OpenAI does by itself for
# every prompt, and the service tier (capacity and price, not the model's reply).
_DROPPED = frozenset({"cache_control", "service_tier"})
_DEFAULTS: dict[str, Any] = {"stream": False, "thinking": {"type": "disabled"}}
_MAPPED = frozenset({"model", "messages", "max_tokens", "system", "temperature", "top_p",
                     "stop_sequences", "metadata", "tools", "tool_choice", "output_config"})
# The name OpenAI requires of a json_schema response format; Anthropic's has none.
SCHEMA_NAME = "output"


def chat_request(params: dict[str, Any], model: str) -> dict[str, Any]:
    """The OpenAI chat body for an Anthropic line's params; Untranslatable names a field
    OpenAI cannot take."""
    for key, value in params.items():
        if key in _MAPPED or key in _DROPPED or value is None or value == _DEFAULTS.get(key):
            continue
        raise untranslatable(f"params.{key}", TO_OPENAI)
    messages = convert_messages(params.get("messages") or [])
    if params.get("system"):
        messages.insert(0, system_message(params["system"]))
    body: dict[str, Any] = {"model": model, "messages": messages,
                            "max_completion_tokens": params.get("max_tokens")}
    for key in ("temperature", "top_p"):
        if params.get(key) is not None:
            body[key] = params[key]
    if params.get("stop_sequences"):
        body["stop"] = list(params["stop_sequences"])
    metadata = params.get("metadata") or {}
    for key in metadata:
        if key != "user_id" and metadata[key] is not None:
            raise untranslatable(f"params.metadata.{key}", TO_OPENAI)
    if metadata.get("user_id") is not None:
        body["user"] = metadata["user_id"]
    if params.get("tools"):
        body["tools"] = tools(params["tools"])
    _tool_choice(params.get("tool_choice"), body)
    _output_config(params.get("output_config") or {}, body)
    return body


def _tool_choice(choice: Any, body: dict[str, Any]) -> None:
    if choice is None:
        return
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "auto":
        body["tool_choice"] = "auto"
    elif kind == "any":
        body["tool_choice"] = "required"
    elif kind == "none":
        body["tool_choice"] = "none"
    elif kind == "tool":
        body["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    else:
        raise untranslatable("params.tool_choice", TO_OPENAI, f"type {kind!r}")
    if choice.get("disable_parallel_tool_use"):
        body["parallel_tool_calls"] = False


def _output_config(config: dict[str, Any], body: dict[str, Any]) -> None:
    for key, value in config.items():
        if key not in ("format", "effort") and value is not None:
            raise untranslatable(f"params.output_config.{key}", TO_OPENAI)
    fmt = config.get("format")
    if fmt is not None:
        if fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
            raise untranslatable("params.output_config.format", TO_OPENAI,
                                 f"type {fmt.get('type')!r}")
        # Anthropic's structured output always follows the schema: OpenAI's strict mode.
        body["response_format"] = {"type": "json_schema", "json_schema": {
            "name": SCHEMA_NAME, "schema": fmt["schema"], "strict": True}}
    effort = config.get("effort")
    if effort is not None:
        if effort not in EFFORTS:
            raise untranslatable("params.output_config.effort", TO_OPENAI, repr(effort))
        body["reasoning_effort"] = effort
