"""The body a `bedrock` deployment is sent for a stored request: a Converse request, or
an InvokeModel body in Anthropic's Messages format (`bedrock_api = "invoke"`).

Both go through the Messages shape: an Anthropic line's params as written, an OpenAI
line translated by to_anthropic.py (its refusals then name Bedrock, not Anthropic).
A few OpenAI fields translate to Messages but not on to Bedrock; they are refused here
by their own path in the line (`body.reasoning_effort`, an image's URL), rather than
by the path of a field the user never wrote.
"""

from typing import Any

from quotaflow.constants import ANTHROPIC_PARAMS
from quotaflow.deployments.deployment import Deployment
from quotaflow.errors import Untranslatable
from quotaflow.providers.translate import TO_ANTHROPIC
from quotaflow.providers.translate.to_anthropic import messages_request
from quotaflow.providers.translate.to_converse import converse_request, pin_cache_control
from quotaflow.providers.translate.to_converse_content import TO_CONVERSE, refuse

# InvokeModel's version field for Anthropic models, in place of the anthropic-version header.
BEDROCK_ANTHROPIC_VERSION = "bedrock-2023-05-31"
TO_INVOKE = "Bedrock InvokeModel (Anthropic)"
# The Messages fields Bedrock's Anthropic models take; `model` is in the URL instead.
_INVOKE_FIELDS = frozenset({"messages", "max_tokens", "system", "temperature", "top_p",
                            "top_k", "stop_sequences", "tools", "tool_choice", "thinking"})
# Fields that cannot change the answer (see to_converse.py), and `model`, which the URL names.
_INVOKE_DROPPED = frozenset({"model", "metadata", "service_tier"})


def bedrock_request(body: dict[str, Any], deployment: Deployment) -> dict[str, Any]:
    """The body `deployment` (a bedrock one) receives; Untranslatable names a field it
    cannot take."""
    invoke = deployment.bedrock_api == "invoke"
    target = TO_INVOKE if invoke else TO_CONVERSE
    params = body.get(ANTHROPIC_PARAMS)
    if not isinstance(params, dict):
        _refuse_openai(body, invoke, target)
        try:
            params = messages_request(body, deployment.model, deployment.default_max_tokens)
        except Untranslatable as exc:
            raise Untranslatable(exc.param, str(exc).replace(TO_ANTHROPIC, target)) from None
    return invoke_request(params) if invoke else converse_request(params)


def _refuse_openai(body: dict[str, Any], invoke: bool, target: str) -> None:
    """The OpenAI fields that have a Messages form but no Bedrock one."""
    if body.get("reasoning_effort") is not None:
        raise refuse("body.reasoning_effort", target=target)
    if not invoke and body.get("parallel_tool_calls") is False:
        raise refuse("body.parallel_tool_calls", "Converse cannot forbid parallel tool calls",
                     target)
    if not invoke and body.get("tools") and body.get("tool_choice") == "none":
        raise refuse("body.tool_choice", "Converse has no tool choice of none", target)
    for i, message in enumerate(body.get("messages") or ()):
        content = message.get("content") if isinstance(message, dict) else None
        for j, part in enumerate(content if isinstance(content, list) else ()):
            image = part.get("image_url") if isinstance(part, dict) else None
            url = str(image.get("url", "")) if isinstance(image, dict) else "data:"
            if not url.startswith("data:"):
                raise refuse(f"body.messages[{i}].content[{j}].image_url.url",
                             "an image URL: Bedrock takes the image's bytes; send it as a "
                             "data: URL", target)


def invoke_request(params: dict[str, Any]) -> dict[str, Any]:
    """InvokeModel's body for an Anthropic model: the params with anthropic_version in
    place of `model`, refusing what Bedrock's Messages API does not take."""
    for key, value in params.items():
        if key in _INVOKE_FIELDS or key in _INVOKE_DROPPED or key == "cache_control" \
                or value is None or (key == "stream" and value is False):
            continue
        raise refuse(f"params.{key}", target=TO_INVOKE)
    params = pin_cache_control(params)
    for i, message in enumerate(params.get("messages") or ()):
        content = message.get("content")
        for j, block in enumerate(content if isinstance(content, list) else ()):
            _check_sources(block, f"params.messages[{i}].content[{j}]")
    for index, tool in enumerate(params.get("tools") or ()):
        if tool.get("type") not in (None, "custom"):
            raise refuse(f"params.tools[{index}]", f"the {tool.get('type')!r} server tool",
                         TO_INVOKE)
    body = {k: v for k, v in params.items() if k in _INVOKE_FIELDS and v is not None}
    return {"anthropic_version": BEDROCK_ANTHROPIC_VERSION, **body}


def _check_sources(block: dict[str, Any], path: str) -> None:
    """Bedrock's Anthropic models take images and documents as data, never by URL."""
    if block.get("type") in ("image", "document"):
        kind = (block.get("source") or {}).get("type")
        if kind not in ("base64", "text", "content"):
            raise refuse(f"{path}.source", f"a {kind!r} source: Bedrock takes the data",
                         TO_INVOKE)
    for n, inner in enumerate(block.get("content") or () if block.get("type") == "tool_result"
                              else ()):
        if isinstance(inner, dict):
            _check_sources(inner, f"{path}.content[{n}]")
