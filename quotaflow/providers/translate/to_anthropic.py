"""An OpenAI chat body as an Anthropic Messages request, for an anthropic deployment.

Every top-level field is mapped, dropped because it cannot change the answer, or
refused by name (docs/deployments/anthropic.md, the translation table). An Anthropic-format
line's own params (kept beside its stored view under ANTHROPIC_PARAMS) go as written,
only `model` set by the deployment: that path costs one dict copy, as before.
"""

from typing import Any

from quotaflow.budget.tokens import max_output_tokens
from quotaflow.constants import ANTHROPIC_PARAMS
from quotaflow.providers.translate import TO_ANTHROPIC, untranslatable
from quotaflow.providers.translate.to_anthropic_content import convert_messages, tool_choice, tools

# Same name and meaning on both sides (top_k: vLLM's extension of the OpenAI shape).
_SAME = ("temperature", "top_p", "top_k")
# Fields that cannot change the answer: labels and billing of OpenAI's stored completions
# and its service tiers, and OpenAI's automatic prompt-cache routing key.
_DROPPED = frozenset({"store", "metadata", "service_tier", "prompt_cache_key",
                      "prompt_cache_retention"})
# Values that ask for nothing beyond the default, the same as leaving the field out.
_DEFAULTS: dict[str, Any] = {"n": 1, "logprobs": False, "frequency_penalty": 0,
                             "presence_penalty": 0, "stream": False}
_MAPPED = frozenset({"model", "messages", "max_tokens", "max_completion_tokens", "stop", "user",
                     "safety_identifier", "tools", "tool_choice", "parallel_tool_calls",
                     "response_format", "reasoning_effort", *_SAME, ANTHROPIC_PARAMS})
_MISSING = object()
# OpenAI's reasoning_effort -> Anthropic's output_config.effort, where they mean the same.
EFFORTS = ("low", "medium", "high", "xhigh")


def messages_request(body: dict[str, Any], model: str, default_max_tokens: int
                     ) -> dict[str, Any]:
    """The Messages API body for a stored request body; Untranslatable names a field of an
    OpenAI body that Anthropic cannot take."""
    params = body.get(ANTHROPIC_PARAMS)
    if isinstance(params, dict):
        return {**params, "model": model}
    _refuse_unmapped(body)
    system, messages = convert_messages(body.get("messages") or [])
    request: dict[str, Any] = {"model": model, "messages": messages,
                               "max_tokens": max_output_tokens(body, default_max_tokens)}
    if system is not None:
        request["system"] = system
    for key in _SAME:
        if body.get(key) is not None:
            request[key] = body[key]
    temperature = body.get("temperature")
    if isinstance(temperature, int | float) and temperature > 1:
        raise untranslatable("body.temperature", TO_ANTHROPIC,
                             f"{temperature} is above Anthropic's maximum of 1")
    stop = body.get("stop")
    if stop is not None:
        request["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    user = _user_id(body)
    if user is not None:
        request["metadata"] = {"user_id": user}
    if body.get("tools"):
        request["tools"] = tools(body["tools"])
        choice = tool_choice(body.get("tool_choice"), body.get("parallel_tool_calls"))
        if choice is not None:
            request["tool_choice"] = choice
    elif body.get("tool_choice") not in (None, "none", "auto"):
        raise untranslatable("body.tool_choice", TO_ANTHROPIC, "without tools")
    output_config = _output_config(body)
    if output_config:
        request["output_config"] = output_config
    return request


def _refuse_unmapped(body: dict[str, Any]) -> None:
    for key, value in body.items():
        if value is None or key in _MAPPED or key in _DROPPED:
            continue
        default = _DEFAULTS.get(key, _MISSING)
        if value == default and isinstance(value, bool) == isinstance(default, bool):
            continue  # e.g. n = 1, but not n = true
        raise untranslatable(f"body.{key}", TO_ANTHROPIC)


def _user_id(body: dict[str, Any]) -> str | None:
    """`user` and its successor `safety_identifier` both name the end user."""
    user, safety = body.get("user"), body.get("safety_identifier")
    if user is not None and safety is not None and user != safety:
        raise untranslatable("body.safety_identifier", TO_ANTHROPIC,
                             "differs from body.user; Anthropic has one metadata.user_id")
    value = safety if safety is not None else user
    return value if isinstance(value, str) else None


def _output_config(body: dict[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = {}
    response_format = body.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") != "text":
        config["format"] = _format(response_format)
    effort = body.get("reasoning_effort")
    if effort is not None:
        if effort not in EFFORTS:
            raise untranslatable("body.reasoning_effort", TO_ANTHROPIC, repr(effort))
        config["effort"] = effort
    return config


def _format(response_format: dict[str, Any]) -> dict[str, Any]:
    kind = response_format.get("type")
    if kind == "json_object":
        raise untranslatable("body.response_format", TO_ANTHROPIC,
                             "json_object: Anthropic's structured output needs a schema; use "
                             "json_schema")
    spec = response_format.get("json_schema")
    if kind != "json_schema" or not isinstance(spec, dict) \
            or not isinstance(spec.get("schema"), dict):
        raise untranslatable("body.response_format", TO_ANTHROPIC, f"type {kind!r}")
    if spec.get("description"):
        # The model reads it; Anthropic's output_config.format carries only the schema.
        raise untranslatable("body.response_format.json_schema.description", TO_ANTHROPIC)
    return {"type": "json_schema", "schema": spec["schema"]}
