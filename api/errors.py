"""One place that turns errors into HTTP answers, in OpenAI's shape.

Every error is `{"error": {"message", "type", "param", "code"}}` as OpenAI writes it:
`type` is "invalid_request_error" for a 4xx and "server_error" for a 5xx (never a
Python class name), `param` names the parameter at fault when one is, and `code` is
OpenAI's where it has one, so the SDK's BadRequestError, NotFoundError, ... carry
them. That holds for quotaflow's errors, Starlette's (413, 404, 405, a body that
does not parse) and an unexpected failure (500) alike. Only a parameter that does
not validate outside /v1 keeps FastAPI's 422 and its `detail` list; under /v1 it
is OpenAI's 400 naming the parameter.

Under /v1/messages/ (Anthropic's Message Batches API) the same answers are made over
into Anthropic's shape by api/anthropic_errors.py.

Bodies are ASCII JSON: a message may quote what the client sent, and a lone
surrogate in it (`"\\ud800"` in a JSON body) cannot be encoded as UTF-8.
"""

import json
import logging
from collections.abc import Mapping
from typing import Any

import psycopg
from fastapi import FastAPI, Request
from fastapi.exception_handlers import request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException

from quotaflow.db import translate_db_errors
from quotaflow.errors import (
    AuthenticationError,
    ConfigError,
    EnqueuedTokenLimit,
    FileTooLarge,
    InputFileError,
    InvalidRequest,
    JobStateError,
    KeyExpired,
    ModelNotAllowed,
    NotFound,
    PermissionDenied,
    QuotaflowError,
    ScopeDenied,
    ServiceUnavailable,
    SpendLimitExceeded,
)

log = logging.getLogger("quotaflow.api")
# What a 503 asks the client to wait before it tries again (Retry-After, whole seconds).
RETRY_AFTER_S = 1

# The status is the error's class's: the nearest of its classes (its own first) listed
# here. A QuotaflowError none of them covers is the server's failure, not the request's.
STATUS_BY_ERROR: dict[type[QuotaflowError], int] = {
    InvalidRequest: 400,
    FileTooLarge: 413,
    NotFound: 404,
    AuthenticationError: 401,
    PermissionDenied: 403,
    EnqueuedTokenLimit: 400,
    SpendLimitExceeded: 400,
    JobStateError: 409,
    ServiceUnavailable: 503,
    ConfigError: 500,
    QuotaflowError: 500,
}

# OpenAI's error codes, so SDK users can branch on `error.code` as they do there.
CODE_BY_ERROR: dict[type[QuotaflowError], str] = {
    AuthenticationError: "invalid_api_key",
    KeyExpired: "expired_api_key",
    ScopeDenied: "insufficient_scope",
    ModelNotAllowed: "model_not_allowed",
    EnqueuedTokenLimit: "token_limit_exceeded",
    SpendLimitExceeded: "spend_limit_exceeded",
    FileTooLarge: "file_too_large",
}


class ErrorDetail(BaseModel):
    """OpenAI's error object."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(BaseModel):
    """What every error answer holds (a refused file adds `data`: its lines' reasons)."""

    error: ErrorDetail


_DESCRIPTIONS = {
    400: "A parameter, the body or the input file is refused (`param` names the parameter)",
    401: "No API key, or one that is unknown, revoked or expired",
    403: "The API key's scope (read, submit, admin), or its operator flag, is below what "
         "this route needs",
    404: "No such object for this key's tenant",
    409: "The job's status does not allow this action",
    413: "The upload is larger than the server's limit",
    503: "PostgreSQL or Redis cannot be reached, or the API is busy: ask again after "
         "Retry-After seconds",
}


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The error answers a route really gives, for its OpenAPI operation: those named, and
    503, as every route reaches PostgreSQL or Redis."""
    return {status: {"model": ErrorBody, "description": _DESCRIPTIONS[status]}
            for status in (*statuses, 503)}


class AsciiJSONResponse(JSONResponse):
    """JSON with every non-ASCII character escaped, so any string can be written."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def error_response(status: int, message: str, *, param: str | None = None,
                   code: str | None = None, headers: Mapping[str, str] | None = None,
                   **extra: Any) -> Response:
    kind = "server_error" if status >= 500 else "invalid_request_error"
    error = {"message": message, "type": kind, "param": param, "code": code, **extra}
    return AsciiJSONResponse(status_code=status, content={"error": error}, headers=headers)


def status_of(exc: QuotaflowError) -> int:
    return next(STATUS_BY_ERROR[kind] for kind in type(exc).__mro__ if kind in STATUS_BY_ERROR)


async def quotaflow_error_handler(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, QuotaflowError)
    status = status_of(exc)
    headers = ({"WWW-Authenticate": "Bearer"} if status == 401
               else {"Retry-After": str(RETRY_AFTER_S)} if status == 503 else None)
    extra: dict[str, Any] = {}
    message = str(exc)
    if isinstance(exc, InputFileError):
        message = exc.message
        extra["data"] = [{"line": p.line_no, "message": p.reason} for p in exc.problems[:1000]]
    return error_response(status, message, param=getattr(exc, "param", None),
                          code=CODE_BY_ERROR.get(type(exc)), headers=headers, **extra)


async def validation_error_handler(request: Request, exc: Exception) -> Response:
    """Under /v1, OpenAI's shape and status for bad parameters (400 invalid_request_error),
    so SDK users get a BadRequestError naming the parameter; elsewhere FastAPI's 422."""
    assert isinstance(exc, RequestValidationError)
    if not request.url.path.startswith("/v1/"):
        return await request_validation_exception_handler(request, exc)
    first = exc.errors()[0] if exc.errors() else {}
    param = ".".join(str(part) for part in first.get("loc", ())[1:]) or None
    message = f"{param}: {first.get('msg', 'invalid')}" if param else first.get("msg", "invalid")
    return error_response(400, message, param=param)


async def http_error_handler(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (413 over the body limit, 404/405 for no such route, 400 for
    a body that does not parse) in the same shape as every other error."""
    assert isinstance(exc, HTTPException)
    if exc.status_code < 400:
        return Response(status_code=exc.status_code, headers=exc.headers)
    headers = exc.headers
    if exc.status_code == 405:
        headers = {**(headers or {}), "Allow": allowed_methods(request)}
    return error_response(exc.status_code, str(exc.detail), headers=headers)


def allowed_methods(request: Request) -> str:
    """Every method the path takes. Starlette names only the first route that matched the
    path, and a path may have several (GET and DELETE /jobs/{id} are two routes)."""
    path = request.scope.get("path", "")
    methods: set[str] = set()
    for route in request.app.router.routes:
        pattern = getattr(route, "path_regex", None)
        if pattern is not None and pattern.match(path):
            methods |= getattr(route, "methods", None) or set()
    return ", ".join(sorted(methods))


async def server_error_handler(request: Request, exc: Exception) -> Response:
    """A failure nothing else answered: OpenAI's server_error with the request's id, which
    the log line names too (Starlette logs the traceback after this answer)."""
    request_id = getattr(request.state, "request_id", None)
    log.error("request %s (%s %s) failed: %r", request_id, request.method, request.url.path,
              exc)
    return error_response(500, f"the server failed on request {request_id}; its log has the "
                          "details", headers={"x-request-id": request_id or ""})


async def outage_handler(request: Request, exc: Exception) -> Response:
    """PostgreSQL or Redis away, or every connection of the pool taken: 503 with what to
    check, as for any ServiceUnavailable, rather than a 500 with a driver's traceback (the
    route is asked again later). The driver's own error (psycopg's, from a COPY on the raw
    connection) reads as SQLAlchemy's."""
    if isinstance(exc, RedisConnectionError | RedisTimeoutError):
        unavailable = ServiceUnavailable(
            f"Redis unreachable ({exc.__class__.__name__}); check QUOTAFLOW_BROKER_URL "
            "(and QUOTAFLOW_REDIS_URL) and that Redis is running")
        return await quotaflow_error_handler(request, unavailable)
    if isinstance(exc, PoolTimeout):
        busy = ServiceUnavailable("every database connection of this API process is in use; "
                                  f"ask again in {RETRY_AFTER_S} s (Retry-After)")
        return await quotaflow_error_handler(request, busy)
    if isinstance(exc, psycopg.OperationalError):
        exc = OperationalError(None, None, exc)
    try:
        with translate_db_errors():
            raise exc
    except QuotaflowError as translated:
        return await quotaflow_error_handler(request, translated)


def install(app: FastAPI) -> None:
    # The Anthropic-compatible routes answer the same errors in Anthropic's shape.
    from api.anthropic_errors import in_route_shape

    app.add_exception_handler(QuotaflowError, in_route_shape(quotaflow_error_handler))
    for outage in (OperationalError, psycopg.OperationalError, RedisConnectionError,
                   RedisTimeoutError, PoolTimeout):
        app.add_exception_handler(outage, in_route_shape(outage_handler))
    app.add_exception_handler(RequestValidationError, in_route_shape(validation_error_handler))
    app.add_exception_handler(HTTPException, in_route_shape(http_error_handler))
    app.add_exception_handler(Exception, in_route_shape(server_error_handler))
