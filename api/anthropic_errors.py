"""Errors of the Anthropic-compatible routes, in Anthropic's shape.

Under /v1/messages/ every error is `{"type": "error", "error": {"type", "message"}}` with
Anthropic's error types (invalid_request_error, authentication_error, not_found_error,
request_too_large, ...), so the Anthropic SDK raises its BadRequestError,
NotFoundError, ... with the message. api/errors.py still decides every status and
message in one place; its answers on these paths are made over here, whatever raised
them (quotaflow's errors, a parameter that does not validate, Starlette's 413 or 404,
an unexpected failure).
"""

import json
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel

from api import errors

PATH_PREFIX = "/v1/messages/"
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "not_found_error", 413: "request_too_large",
               429: "rate_limit_error", 529: "overloaded_error"}
_DROPPED_HEADERS = ("content-length", "content-type")

Handler = Callable[[Request, Exception], Awaitable[Response]]


class AnthropicError(BaseModel):
    type: str
    message: str


class AnthropicErrorBody(BaseModel):
    """What every error answer of the Anthropic-compatible routes holds."""

    type: Literal["error"]
    error: AnthropicError


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """api.errors.responses, documented in Anthropic's shape."""
    return {status: {**answer, "model": AnthropicErrorBody}
            for status, answer in errors.responses(*statuses).items()}


def error_type(status: int) -> str:
    return ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def reshape(response: Response) -> Response:
    """An answer of api/errors.py ({"error": {"message", ...}}) in Anthropic's shape."""
    try:
        message = str(json.loads(bytes(response.body))["error"]["message"])
    except (ValueError, KeyError, TypeError):
        message = bytes(response.body).decode("utf-8", "replace") or "error"
    headers = {name: value for name, value in response.headers.items()
               if name not in _DROPPED_HEADERS}
    body = {"type": "error", "error": {"type": error_type(response.status_code),
                                       "message": message}}
    return errors.AsciiJSONResponse(body, status_code=response.status_code, headers=headers)


def in_route_shape(handler: Handler) -> Handler:
    """The handler, answering in Anthropic's shape on the Anthropic-compatible paths."""
    async def handle(request: Request, exc: Exception) -> Response:
        response = await handler(request, exc)
        if request.url.path.startswith(PATH_PREFIX) and response.status_code >= 400:
            return reshape(response)
        return response
    return handle
