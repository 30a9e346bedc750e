"""What Google's generateContent refuses with 400 INVALID_ARGUMENT, checked the way its
documentation describes the request (GenerateContentRequest, Content, Part, Schema).

Unknown fields are refused as Google's JSON parser refuses them ("Invalid JSON payload
received. Unknown name ..."), so a translation that invents a field, puts one at the
wrong level or sends a JSON Schema keyword outside Gemini's Schema subset fails here as
it would at Google, rather than passing a lenient mock.
"""

import base64
import binascii
from typing import Any

TOP = frozenset({"contents", "systemInstruction", "generationConfig", "tools", "toolConfig",
                 "safetySettings", "cachedContent", "labels"})
CONFIG = frozenset({"maxOutputTokens", "stopSequences", "temperature", "topP", "topK",
                    "candidateCount", "seed", "presencePenalty", "frequencyPenalty",
                    "responseMimeType", "responseSchema", "responseLogprobs", "logprobs",
                    "thinkingConfig", "mediaResolution"})
PART_DATA = frozenset({"text", "inlineData", "fileData", "functionCall", "functionResponse"})
SCHEMA = frozenset({"type", "format", "title", "description", "nullable", "enum", "maxItems",
                    "minItems", "properties", "required", "minProperties", "maxProperties",
                    "minLength", "maxLength", "pattern", "example", "anyOf", "propertyOrdering",
                    "default", "items", "minimum", "maximum"})
TYPES = frozenset({"STRING", "NUMBER", "INTEGER", "BOOLEAN", "ARRAY", "OBJECT", "NULL"})
MODES = frozenset({"AUTO", "ANY", "NONE", "VALIDATED"})
MIME_TYPES = frozenset({"text/plain", "application/json", "text/x.enum"})


def unknown(where: str, obj: dict[str, Any], known: frozenset[str]) -> str | None:
    extra = sorted(set(obj) - known)
    if extra:
        return (f'Invalid JSON payload received. Unknown name "{extra[0]}" at \'{where}\': '
                "Cannot find field.")
    return None


def request_problem(body: Any) -> str | None:
    """Why generateContent would answer 400 INVALID_ARGUMENT, or None."""
    if not isinstance(body, dict):
        return "Invalid JSON payload received. Expected an object."
    problem = unknown("", body, TOP)
    contents = body.get("contents")
    if problem is None and (not isinstance(contents, list) or not contents):
        problem = "* GenerateContentRequest.contents: contents is not specified"
    for n, content in enumerate(contents or ()):
        problem = problem or _content(content, f"contents[{n}]", roles=("user", "model"))
    if problem is None and "systemInstruction" in body:
        problem = _content(body["systemInstruction"], "system_instruction", roles=("user",))
    problem = problem or _config(body.get("generationConfig") or {})
    problem = problem or _tools(body.get("tools") or [], body.get("toolConfig"))
    return problem or _responses_follow_calls(contents or [])


def _content(content: Any, where: str, roles: tuple[str, ...]) -> str | None:
    if not isinstance(content, dict):
        return f"{where}: a Content object is required"
    problem = unknown(where, content, frozenset({"role", "parts"}))
    if problem:
        return problem
    if content.get("role", "user") not in roles:
        return f"{where}.role: Please use a valid role: {', '.join(roles)}."
    parts = content.get("parts")
    if not isinstance(parts, list) or not parts:
        return f"* GenerateContentRequest.{where}.parts: contents.parts must not be empty."
    for n, part in enumerate(parts):
        problem = _part(part, f"{where}.parts[{n}]")
        if problem:
            return problem
    return None


def _part(part: Any, where: str) -> str | None:
    if not isinstance(part, dict):
        return f"{where}: a Part object is required"
    problem = unknown(where, part, PART_DATA | {"thought", "thoughtSignature"})
    data = [key for key in part if key in PART_DATA]
    if problem or len(data) != 1:
        return problem or f"{where}: a Part holds exactly one of {sorted(PART_DATA)}"
    value = part[data[0]]
    if data[0] == "text":
        return None if isinstance(value, str) else f"{where}.text: a string is required"
    if data[0] == "inlineData":
        problem = unknown(f"{where}.inline_data", value, frozenset({"mimeType", "data"}))
        try:
            base64.b64decode(str(value.get("data")), validate=True)
        except binascii.Error:
            problem = problem or f"{where}.inline_data.data: Invalid value (not base64)"
        return problem or (None if value.get("mimeType") else f"{where}: mimeType is required")
    if data[0] == "functionCall":
        problem = unknown(f"{where}.function_call", value, frozenset({"id", "name", "args"}))
        return problem or (None if isinstance(value.get("args", {}), dict) and value.get("name")
                           else f"{where}.function_call: name and object args are required")
    if data[0] == "functionResponse":
        problem = unknown(f"{where}.function_response", value,
                          frozenset({"id", "name", "response"}))
        return problem or (None if isinstance(value.get("response"), dict) and value.get("name")
                           else f"{where}.function_response: name and response are required")
    return None


def _config(config: dict[str, Any]) -> str | None:
    problem = unknown("generation_config", config, CONFIG)
    if problem:
        return problem
    tokens = config.get("maxOutputTokens")
    if tokens is not None and (not isinstance(tokens, int) or tokens < 1):
        return "generation_config.max_output_tokens: must be a positive integer"
    if len(config.get("stopSequences") or ()) > 5:
        return "generation_config.stop_sequences: at most 5 stop sequences"
    if not 0 <= config.get("temperature", 1) <= 2:
        return "generation_config.temperature: must be in [0.0, 2.0]"
    mime = config.get("responseMimeType")
    if mime is not None and mime not in MIME_TYPES:
        return f"generation_config.response_mime_type: {mime!r} is not supported"
    if "responseSchema" in config:
        if mime != "application/json":
            return "response_schema needs response_mime_type application/json"
        return schema_problem(config["responseSchema"], "generation_config.response_schema")
    return None


def schema_problem(schema: Any, where: str) -> str | None:
    """Gemini's Schema object: its own keywords only, the type enum upper-case."""
    if not isinstance(schema, dict):
        return f"{where}: a Schema object is required"
    problem = unknown(where, schema, SCHEMA)
    if problem is None and "type" in schema and schema["type"] not in TYPES:
        problem = f"{where}.type: Invalid value {schema['type']!r} (TYPE_ENUM)"
    for name, sub in (schema.get("properties") or {}).items():
        problem = problem or schema_problem(sub, f"{where}.properties[{name}]")
    if problem is None and "items" in schema:
        problem = schema_problem(schema["items"], f"{where}.items")
    for n, sub in enumerate(schema.get("anyOf") or ()):
        problem = problem or schema_problem(sub, f"{where}.any_of[{n}]")
    order = schema.get("propertyOrdering")
    if problem is None and order is not None and set(order) != set(schema.get("properties", {})):
        problem = f"{where}.property_ordering: must name each property once"
    return problem


def _tools(tools: list[Any], tool_config: Any) -> str | None:
    names: set[str] = set()
    for n, tool in enumerate(tools):
        problem = unknown(f"tools[{n}]", tool, frozenset({"functionDeclarations"}))
        if problem:
            return problem
        for m, declaration in enumerate(tool.get("functionDeclarations") or ()):
            where = f"tools[{n}].function_declarations[{m}]"
            problem = unknown(where, declaration,
                              frozenset({"name", "description", "parameters"}))
            if "parameters" in declaration:
                problem = problem or schema_problem(declaration["parameters"],
                                                    f"{where}.parameters")
            if problem:
                return problem
            names.add(str(declaration.get("name")))
    if tool_config is None:
        return None
    calling = tool_config.get("functionCallingConfig") or {}
    problem = unknown("tool_config", tool_config, frozenset({"functionCallingConfig"})) or \
        unknown("tool_config.function_calling_config", calling,
                frozenset({"mode", "allowedFunctionNames"}))
    if problem is None and calling.get("mode") not in MODES:
        problem = f"function_calling_config.mode: Invalid value {calling.get('mode')!r}"
    allowed = calling.get("allowedFunctionNames")
    if problem is None and allowed and (calling.get("mode") != "ANY" or set(allowed) - names):
        problem = "allowed_function_names: only with mode ANY, naming declared functions"
    return problem


def _responses_follow_calls(contents: list[dict[str, Any]]) -> str | None:
    """A functionResponse answers a functionCall of the model turn before it, by name."""
    called: set[str] = set()
    for n, content in enumerate(contents):
        for part in content.get("parts") or ():
            if "functionCall" in part:
                called.add(part["functionCall"].get("name"))
            if "functionResponse" in part and part["functionResponse"]["name"] not in called:
                return (f"contents[{n}]: function response "
                        f"{part['functionResponse']['name']!r} answers no function call")
    return None
