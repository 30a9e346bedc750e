"""What the strict Bedrock mock refuses, as Bedrock Runtime would: a SigV4 signature
that does not match (403), and a Converse or InvokeModel body the real API answers
with a 400 ValidationException.

The signature is recomputed with botocore's own signer from the test's known secret and
the request exactly as it arrived (its raw, still percent-encoded path, the headers it
names as signed, its body bytes), never from what the client says it signed: a client
that signs one thing and sends another is refused as AWS refuses it. The Converse
shapes follow botocore's service model of bedrock-runtime (one key per content block,
roles alternating from a user turn, inferenceConfig's names and ranges).
"""

import base64
import binascii
import hmac
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from mock_provider.shapes import messages_problem

_AUTH = re.compile(r"AWS4-HMAC-SHA256 Credential=([^/,]+)/(\d{8})/([^/,]+)/([^/,]+)/aws4_request,"
                   r" ?SignedHeaders=([a-z0-9;-]+), ?Signature=([0-9a-f]{64})")
MAX_SKEW_S = 300
SERVICE = "bedrock"
CONVERSE_FIELDS = frozenset({
    "messages", "system", "inferenceConfig", "toolConfig", "guardrailConfig",
    "additionalModelRequestFields", "promptVariables", "additionalModelResponseFieldPaths",
    "requestMetadata", "performanceConfig", "serviceTier", "outputConfig"})
CONTENT_KEYS = frozenset({"text", "image", "document", "video", "audio", "toolUse", "toolResult",
                          "guardContent", "cachePoint", "reasoningContent", "citationsContent",
                          "searchResult"})
INFERENCE_KEYS = frozenset({"maxTokens", "temperature", "topP", "stopSequences"})
IMAGE_FORMATS = frozenset({"png", "jpeg", "gif", "webp"})
DOCUMENT_FORMATS = frozenset({"pdf", "csv", "doc", "docx", "xls", "xlsx", "html", "txt", "md"})
DOCUMENT_NAME = re.compile(r"[A-Za-z0-9\-()\[\]]+( [A-Za-z0-9\-()\[\]]+)*")
TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
ANTHROPIC_VERSION = "bedrock-2023-05-31"
INVOKE_FIELDS = frozenset({"anthropic_version", "anthropic_beta", "max_tokens", "system",
                           "messages", "temperature", "top_p", "top_k", "stop_sequences",
                           "tools", "tool_choice", "thinking"})


@dataclass(frozen=True)
class AwsKey:
    """The one access key the mock knows, its secret, and the region it serves."""

    access_key_id: str
    secret: str
    region: str = "us-east-1"


def signature_problem(key: AwsKey, headers: Any, raw_path: str, query: str, body: bytes,
                      now: datetime | None = None) -> tuple[str, str] | None:
    """(exception name, message) of a request whose signature AWS would refuse, or None."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    given = headers.get("authorization")
    if not given:
        return "MissingAuthenticationTokenException", "Missing Authentication Token"
    match = _AUTH.fullmatch(given)
    if match is None:
        return ("IncompleteSignatureException",
                "Authorization header requires Credential, SignedHeaders and Signature.")
    key_id, day, region, service, signed, signature = match.groups()
    if not hmac.compare_digest(key_id, key.access_key_id):
        return ("UnrecognizedClientException",
                "The security token included in the request is invalid.")
    if region != key.region or service != SERVICE:
        return ("InvalidSignatureException", f"Credential should be scoped to a valid region "
                f"('{key.region}') and to the service '{SERVICE}', not '{region}/{service}'.")
    stamp = headers.get("x-amz-date", "")
    try:
        when = datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    except ValueError:
        return "IncompleteSignatureException", "X-Amz-Date is missing or not YYYYMMDDTHHMMSSZ."
    if abs(((now or datetime.now(UTC)) - when).total_seconds()) > MAX_SKEW_S or day != stamp[:8]:
        return "InvalidSignatureException", f"Signature expired: {stamp} is out of range."
    names = signed.split(";")
    if "host" not in names or "x-amz-date" not in names:
        return "InvalidSignatureException", "host and x-amz-date must be signed headers."
    url = f"http://{headers.get('host', '')}{raw_path}" + (f"?{query}" if query else "")
    request = AWSRequest(method="POST", url=url, data=body,
                         headers={name: headers.get(name, "") for name in names})
    request.context["timestamp"] = stamp
    signer = SigV4Auth(Credentials(key.access_key_id, key.secret), SERVICE, region)
    expected = signer.signature(signer.string_to_sign(request, signer.canonical_request(request)),
                                request)
    if not hmac.compare_digest(expected, signature):
        return ("InvalidSignatureException", "The request signature we calculated does not "
                "match the signature you provided. Check your AWS Secret Access Key and signing "
                "method. Consult the service documentation for details.")
    return None


def converse_problem(body: Any) -> str | None:
    """Why Converse would refuse this body with a ValidationException, or None."""
    if not isinstance(body, dict):
        return "Malformed input request: the body must be a JSON object"
    unknown = sorted(set(body) - CONVERSE_FIELDS)
    if unknown:
        return f"Malformed input request: extraneous key [{unknown[0]}] is not permitted"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: a non-empty list is required"
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role != ("user" if i % 2 == 0 else "assistant"):
            return ("A conversation must start with a user message and alternate between user "
                    f"and assistant roles (messages.{i}.role is {role!r}).")
        problem = _blocks(message.get("content"), f"messages.{i}.content", CONTENT_KEYS)
        if problem:
            return problem
    for j, block in enumerate(body.get("system") or []):
        if not isinstance(block, dict) or len(block) != 1 or not (
                block.get("text") or "cachePoint" in block):
            return f"system.{j}: one non-empty text or a cachePoint is required"
    return (_inference(body.get("inferenceConfig") or {}) or _tools(body, messages)
            or _output(body.get("outputConfig")))


def _blocks(content: Any, path: str, keys: frozenset[str]) -> str | None:
    if not isinstance(content, list) or not content:
        return f"{path}: a non-empty list of content blocks is required"
    for j, block in enumerate(content):
        where = f"{path}.{j}"
        if not isinstance(block, dict) or len(block) != 1 or next(iter(block)) not in keys:
            return f"{where}: exactly one member of ContentBlock must be set"
        kind, value = next(iter(block.items()))
        problem = _block(kind, value, where)
        if problem:
            return f"{where}.{kind}: {problem}"
    return None


def _block(kind: str, value: Any, path: str) -> str | None:  # noqa: C901 - one case a kind
    if kind == "text":
        return None if isinstance(value, str) else "a string is required"
    if kind == "image":
        if value.get("format") not in IMAGE_FORMATS:
            return f"format {value.get('format')!r} is not one of {sorted(IMAGE_FORMATS)}"
        return _bytes((value.get("source") or {}).get("bytes"))
    if kind == "document":
        if not DOCUMENT_NAME.fullmatch(str(value.get("name", ""))):
            return f"name {value.get('name')!r} has characters a document name cannot have"
        if value.get("format") not in DOCUMENT_FORMATS:
            return f"format {value.get('format')!r} is not a document format"
        source = value.get("source") or {}
        return None if isinstance(source.get("text"), str) else _bytes(source.get("bytes"))
    if kind == "toolUse":
        if not TOOL_NAME.fullmatch(str(value.get("name"))) or not value.get("toolUseId") \
                or not isinstance(value.get("input"), dict):
            return "toolUseId, a valid name and an input object are required"
    elif kind == "toolResult":
        if not value.get("toolUseId") or value.get("status", "success") not in (
                "success", "error"):
            return "toolUseId is required and status is success or error"
        return _blocks(value.get("content"), f"{path}.content",
                       frozenset({"text", "json", "image", "document"}))
    elif kind == "cachePoint":
        if value.get("type") != "default" or value.get("ttl", "5m") not in ("5m", "1h"):
            return "type must be 'default' and ttl '5m' or '1h'"
    elif kind == "reasoningContent":
        text = value.get("reasoningText")
        if not (isinstance(text, dict) and isinstance(text.get("text"), str)) \
                and "redactedContent" not in value:
            return "reasoningText.text or redactedContent is required"
    return None


def _bytes(value: Any) -> str | None:
    try:
        base64.b64decode(str(value), validate=True)
    except (binascii.Error, ValueError):
        return "source.bytes must be base64"
    return None if value else "source.bytes is required"


def _inference(config: dict[str, Any]) -> str | None:
    unknown = sorted(set(config) - INFERENCE_KEYS)
    if unknown:
        return f"inferenceConfig: extraneous key [{unknown[0]}] is not permitted"
    if "maxTokens" in config and not (isinstance(config["maxTokens"], int)
                                      and config["maxTokens"] >= 1):
        return "inferenceConfig.maxTokens must be an integer of at least 1"
    for name in ("temperature", "topP"):
        if name in config and not 0 <= config[name] <= 1:
            return f"inferenceConfig.{name} must be between 0 and 1"
    stops = config.get("stopSequences", [])
    return None if all(isinstance(s, str) for s in stops) else "stopSequences: strings only"


def _tools(body: dict[str, Any], messages: list[dict[str, Any]]) -> str | None:
    config = body.get("toolConfig")
    if config is None:
        used = any(isinstance(b, dict) and ("toolUse" in b or "toolResult" in b)
                   for m in messages for b in m["content"])
        return ("The toolConfig field must be defined when using toolUse and toolResult "
                "content blocks.") if used else None
    for n, tool in enumerate(config.get("tools") or [None]):
        spec = tool.get("toolSpec") if isinstance(tool, dict) and len(tool) == 1 else None
        if spec is None and not (isinstance(tool, dict) and "cachePoint" in tool):
            return f"toolConfig.tools.{n}: one toolSpec or cachePoint is required"
        if spec is not None and (not TOOL_NAME.fullmatch(str(spec.get("name"))) or not
                                 isinstance((spec.get("inputSchema") or {}).get("json"), dict)):
            return f"toolConfig.tools.{n}.toolSpec: a valid name and inputSchema.json required"
    choice = config.get("toolChoice")
    if choice is not None and (len(choice) != 1 or next(iter(choice)) not in (
            "auto", "any", "tool")):
        return "toolConfig.toolChoice: exactly one of auto, any, tool must be set"
    return None


def _output(config: Any) -> str | None:
    if config is None:
        return None
    fmt = config.get("textFormat") or {}
    schema = ((fmt.get("structure") or {}).get("jsonSchema") or {}).get("schema")
    try:
        parsed = json.loads(schema) if isinstance(schema, str) else None
    except ValueError:
        parsed = None
    if fmt.get("type") != "json_schema" or not isinstance(parsed, dict):
        return "outputConfig.textFormat: json_schema with a JSON schema string is required"
    return None


def invoke_problem(body: Any) -> str | None:
    """Why InvokeModel would refuse this Anthropic Messages body, or None."""
    if not isinstance(body, dict):
        return "Malformed input request: the body must be a JSON object"
    unknown = sorted(set(body) - INVOKE_FIELDS)
    if unknown:
        return (f"Malformed input request: #: extraneous key [{unknown[0]}] is not permitted, "
                "please reformat your input and try again.")
    if body.get("anthropic_version") != ANTHROPIC_VERSION:
        return f"anthropic_version: must be {ANTHROPIC_VERSION!r}"
    if not isinstance(body.get("max_tokens"), int) or not isinstance(body.get("messages"), list):
        return "max_tokens and messages are required"
    for i, message in enumerate(body["messages"]):
        for j, block in enumerate(message.get("content") if isinstance(
                message.get("content"), list) else ()):
            source = block.get("source") if isinstance(block, dict) else None
            if isinstance(source, dict) and source.get("type") not in ("base64", "text"):
                return f"messages.{i}.content.{j}.source: type {source.get('type')!r} not supported"
    return messages_problem(body)
