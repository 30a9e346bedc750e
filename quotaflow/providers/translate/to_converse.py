"""Anthropic Messages params as a Bedrock Converse request body.

Every line reaches Bedrock through the Messages shape (an OpenAI line is translated to
it first, to_anthropic.py), so OpenAI and Anthropic lines share one mapping to Converse
and one table of what maps to what (docs/deployments/bedrock.md). Every top-level
field is mapped, dropped because it cannot change the answer, or refused by name. The
model is not in the body: Converse names it in the URL.
"""

import json
from typing import Any

from quotaflow.providers.translate.to_converse_content import (
    messages,
    refuse,
    system_blocks,
    tool_config,
)

# Fields that cannot change the answer: the end user's id (abuse tracking) and
# Anthropic's own service tier (capacity and price).
_DROPPED = frozenset({"metadata", "service_tier"})
# Values that ask for nothing beyond the default, the same as leaving the field out.
_DEFAULTS: dict[str, Any] = {"stream": False, "thinking": {"type": "disabled"}}
_MAPPED = frozenset({"model", "messages", "max_tokens", "system", "temperature", "top_p",
                     "top_k", "stop_sequences", "tools", "tool_choice", "output_config",
                     "thinking", "cache_control"})
# Claude's own fields Converse passes through additionalModelRequestFields, as AWS
# documents for Anthropic models (top_k, extended thinking).
_MODEL_FIELDS = ("top_k", "thinking")


def converse_request(params: dict[str, Any]) -> dict[str, Any]:
    """The Converse body for Messages params; Untranslatable names a field Converse
    cannot take."""
    for key, value in params.items():
        if key in _MAPPED or key in _DROPPED or value is None or value == _DEFAULTS.get(key):
            continue
        raise refuse(f"params.{key}")
    params = pin_cache_control(params)
    request: dict[str, Any] = {"messages": messages(params.get("messages") or [])}
    system = system_blocks(params.get("system") or [])
    if system:
        request["system"] = system
    request["inferenceConfig"] = _inference(params)
    if params.get("tools"):
        request["toolConfig"] = tool_config(params["tools"], params.get("tool_choice"))
    elif params.get("tool_choice") not in (None, {"type": "auto"}):
        raise refuse("params.tool_choice", "without tools")
    extra = {key: params[key] for key in _MODEL_FIELDS
             if params.get(key) is not None and params[key] != _DEFAULTS.get(key)}
    if extra:
        request["additionalModelRequestFields"] = extra
    output = _output_config(params.get("output_config") or {})
    if output:
        request["outputConfig"] = output
    return request


def pin_cache_control(params: dict[str, Any]) -> dict[str, Any]:
    """Top-level cache_control (cache the whole prompt) set on the last message's last
    block instead, where Anthropic itself puts the cache point; Bedrock has no
    top-level form. The params are not changed in place."""
    control = params.get("cache_control")
    if control is None or not params.get("messages"):
        return {k: v for k, v in params.items() if k != "cache_control"}
    *earlier, last = params["messages"]
    content = last.get("content")
    blocks = ([{"type": "text", "text": content}] if isinstance(content, str)
              else [dict(block) for block in content or []])
    if blocks and blocks[-1].get("cache_control") is None:
        blocks[-1]["cache_control"] = control
    rest = {k: v for k, v in params.items() if k != "cache_control"}
    return {**rest, "messages": [*earlier, {**last, "content": blocks}]}


def _inference(params: dict[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = {"maxTokens": params.get("max_tokens")}
    if params.get("temperature") is not None:
        config["temperature"] = params["temperature"]
    if params.get("top_p") is not None:
        config["topP"] = params["top_p"]
    if params.get("stop_sequences"):
        config["stopSequences"] = list(params["stop_sequences"])
    return config


def _output_config(config: dict[str, Any]) -> dict[str, Any]:
    """Structured output as Converse's textFormat (its schema is JSON text); effort has
    no Converse form."""
    for key, value in config.items():
        if key != "format" and value is not None:
            raise refuse(f"params.output_config.{key}")
    fmt = config.get("format")
    if fmt is None:
        return {}
    if fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise refuse("params.output_config.format", f"type {fmt.get('type')!r}")
    return {"textFormat": {"type": "json_schema", "structure": {"jsonSchema": {
        "schema": json.dumps(fmt["schema"], ensure_ascii=False)}}}}
