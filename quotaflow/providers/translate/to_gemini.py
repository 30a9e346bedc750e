"""A stored request as a Gemini generateContent body, for a gemini or vertex deployment.

An OpenAI chat body is translated field by field: every top-level field is mapped,
dropped because it cannot change the answer, or refused by name
(docs/deployments/google.md, the translation table). An Anthropic line's params are
first made an OpenAI chat body (to_openai.py, which refuses by `params.` name what
OpenAI's shape cannot hold), then translated the same way; `top_k`, which Gemini has
and OpenAI lacks, is carried across. The model is not in the body: it is in the URL.
"""

from typing import Any

from quotaflow.budget.tokens import max_output_tokens
from quotaflow.constants import ANTHROPIC_PARAMS
from quotaflow.errors import Untranslatable
from quotaflow.providers.translate.gemini_schema import gemini_schema
from quotaflow.providers.translate.gemini_schema import gemini_untranslatable as refuse
from quotaflow.providers.translate.to_gemini_content import convert_messages
from quotaflow.providers.translate.to_openai import chat_request

# OpenAI's sampling fields -> generationConfig's, same meaning and range.
_SAME = {"temperature": "temperature", "top_p": "topP", "top_k": "topK", "seed": "seed",
         "presence_penalty": "presencePenalty", "frequency_penalty": "frequencyPenalty"}
# Fields that cannot change the answer: the end user's id (abuse monitoring), labels and
# billing of OpenAI's stored completions, its service tiers and prompt-cache routing.
_DROPPED = frozenset({"model", "user", "safety_identifier", "store", "metadata",
                      "service_tier", "prompt_cache_key", "prompt_cache_retention"})
_DEFAULTS: dict[str, Any] = {"n": 1, "logprobs": False, "stream": False,
                             "parallel_tool_calls": True, "frequency_penalty": 0,
                             "presence_penalty": 0}
_MAPPED = frozenset({"messages", "max_tokens", "max_completion_tokens", "stop", "n", "tools",
                     "tool_choice", "response_format", *_SAME})
_MISSING = object()
JSON = "application/json"
# What an Anthropic line's field is called once read as OpenAI chat -> its own name.
PARAMS_NAMES = {"body.parallel_tool_calls": "params.tool_choice.disable_parallel_tool_use",
                "body.reasoning_effort": "params.output_config.effort"}


def generate_request(body: dict[str, Any], default_max_tokens: int) -> dict[str, Any]:
    """The generateContent body for a stored request body; Untranslatable names a field
    Gemini cannot take."""
    params = body.get(ANTHROPIC_PARAMS)
    if not isinstance(params, dict):
        return _from_chat(body, default_max_tokens)
    _refuse_url_images(params)
    top_k = params.get("top_k")
    try:
        chat = chat_request({k: v for k, v in params.items() if k != "top_k"}, "")
    except Untranslatable as exc:  # named as the line names it; the reason Gemini's
        detail = str(exc).split(" has no ", 1)[0].removeprefix(exc.param).strip(" ()")
        raise refuse(exc.param, detail) from None
    try:
        request = _from_chat(chat, default_max_tokens)
    except Untranslatable as exc:
        if exc.param in PARAMS_NAMES:  # the same field, by the name the line gave it
            raise refuse(PARAMS_NAMES[exc.param]) from None
        raise Untranslatable(exc.param, f"{exc} (a field of the line as OpenAI chat, which its "
                                        "params are read as first)") from None
    if top_k is not None:
        request.setdefault("generationConfig", {})["topK"] = top_k
    return request


def _refuse_url_images(params: dict[str, Any]) -> None:
    """An image by URL, named as the line wrote it (Gemini fetches no URLs)."""
    for i, message in enumerate(params.get("messages") or ()):
        content = message.get("content") if isinstance(message, dict) else None
        for j, block in enumerate(content if isinstance(content, list) else ()):
            source = block.get("source") if isinstance(block, dict) else None
            if block.get("type") == "image" and isinstance(source, dict) \
                    and source.get("type") == "url":
                raise refuse(f"params.messages[{i}].content[{j}].source",
                             "an image URL: Gemini takes images inline; send it as base64")


def _from_chat(body: dict[str, Any], default_max_tokens: int) -> dict[str, Any]:
    _refuse_unmapped(body)
    system, contents = convert_messages(body.get("messages") or [])
    request: dict[str, Any] = {"contents": contents}
    if system is not None:
        request["systemInstruction"] = system
    config: dict[str, Any] = {"maxOutputTokens": max_output_tokens(body, default_max_tokens)}
    for key, name in _SAME.items():
        if body.get(key) is not None and body[key] != _DEFAULTS.get(key):
            config[name] = body[key]
    stop = body.get("stop")
    if stop:
        config["stopSequences"] = [stop] if isinstance(stop, str) else list(stop)
    if body.get("n") not in (None, 1):
        config["candidateCount"] = body["n"]
    config |= _response_format(body.get("response_format"))
    request["generationConfig"] = config
    if body.get("tools"):
        request["tools"] = [{"functionDeclarations": _declarations(body["tools"])}]
        strict = any((t.get("function") or {}).get("strict") for t in body["tools"])
        tool_config = _tool_config(body.get("tool_choice"), strict)
        if tool_config is not None:
            request["toolConfig"] = tool_config
    elif body.get("tool_choice") not in (None, "none", "auto"):
        raise refuse("body.tool_choice", "without tools")
    return request


def _refuse_unmapped(body: dict[str, Any]) -> None:
    for key, value in body.items():
        if value is None or key in _DROPPED:
            continue
        default = _DEFAULTS.get(key, _MISSING)
        if value == default and isinstance(value, bool) == isinstance(default, bool):
            continue  # e.g. n = 1, but not n = true
        if key not in _MAPPED:
            raise refuse(f"body.{key}")
        if key == "n" and not isinstance(value, int):
            raise refuse("body.n", repr(value))


def _response_format(response_format: Any) -> dict[str, Any]:
    if not isinstance(response_format, dict) or response_format.get("type") == "text":
        return {}
    kind = response_format.get("type")
    if kind == "json_object":
        return {"responseMimeType": JSON}
    spec = response_format.get("json_schema")
    if kind != "json_schema" or not isinstance(spec, dict) \
            or not isinstance(spec.get("schema"), dict):
        raise refuse("body.response_format", f"type {kind!r}")
    if spec.get("description"):
        # The model reads it; Gemini's responseSchema carries only the schema.
        raise refuse("body.response_format.json_schema.description")
    # `strict` needs no counterpart: Gemini's output always follows a responseSchema.
    return {"responseMimeType": JSON, "responseSchema": gemini_schema(
        spec["schema"], "body.response_format.json_schema.schema")}


def _declarations(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for index, tool in enumerate(tools):
        path = f"body.tools[{index}]"
        if tool.get("type") != "function":
            raise refuse(path, f"a {tool.get('type')!r} tool")
        for key, value in tool.items():
            if key not in ("type", "function", "cache_control") and value is not None:
                raise refuse(f"{path}.{key}")
        function = tool.get("function") or {}
        for key, value in function.items():
            if key not in ("name", "description", "parameters", "strict") and value is not None:
                raise refuse(f"{path}.function.{key}")
        made: dict[str, Any] = {"name": function.get("name")}
        if function.get("description") is not None:
            made["description"] = function["description"]
        parameters = function.get("parameters")
        if parameters and parameters.get("properties") != {}:
            made["parameters"] = gemini_schema(parameters, f"{path}.function.parameters")
        out.append(made)
    return out


def _tool_config(choice: Any, strict: bool) -> dict[str, Any] | None:
    """tool_choice as functionCallingConfig's mode; a strict tool's arguments held to its
    schema by VALIDATED (ANY holds them already)."""
    if choice is None or choice == "auto":
        config: dict[str, Any] = {"mode": "VALIDATED"} if strict else {}
    elif choice == "none":
        config = {"mode": "NONE"}
    elif choice == "required":
        config = {"mode": "ANY"}
    elif isinstance(choice, dict) and choice.get("type") == "function":
        config = {"mode": "ANY",
                  "allowedFunctionNames": [(choice.get("function") or {}).get("name")]}
    else:
        raise refuse("body.tool_choice", repr(choice))
    return {"functionCallingConfig": config} if config else None
