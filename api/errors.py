"""One place that turns quotaflow's errors into HTTP answers (OpenAI's error shape)."""

from fastapi import FastAPI, Request
from fastapi.exception_handlers import request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from sqlalchemy.exc import OperationalError

from quotaflow.db import translate_db_errors
from quotaflow.errors import (
    AuthenticationError,
    ConfigError,
    DeploymentNotFound,
    EnqueuedTokenLimit,
    FileNotFound,
    FileTooLarge,
    InputFileError,
    JobNotFound,
    JobStateError,
    QuotaflowError,
    ServiceUnavailable,
)

STATUS_BY_ERROR: list[tuple[type[QuotaflowError], int]] = [
    (JobNotFound, 404),
    (FileNotFound, 404),
    (AuthenticationError, 401),
    (FileTooLarge, 413),
    (EnqueuedTokenLimit, 400),
    (DeploymentNotFound, 404),
    (InputFileError, 400),
    (JobStateError, 409),
    (ServiceUnavailable, 503),
    (ConfigError, 500),
    (QuotaflowError, 400),
]

# OpenAI's error codes, so SDK users can branch on `error.code` as they do there.
CODE_BY_ERROR: dict[type[QuotaflowError], str] = {
    AuthenticationError: "invalid_api_key",
    EnqueuedTokenLimit: "token_limit_exceeded",
    FileTooLarge: "file_too_large",
}


async def quotaflow_error_handler(_request: Request, exc: Exception) -> JSONResponse:
    status = next(code for kind, code in STATUS_BY_ERROR if isinstance(exc, kind))
    error: dict = {"message": str(exc), "type": exc.__class__.__name__,
                   "code": CODE_BY_ERROR.get(type(exc))}
    if isinstance(exc, InputFileError):
        error["message"] = exc.message
        error["data"] = [{"line": p.line_no, "message": p.reason} for p in exc.problems[:1000]]
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(status_code=status, content={"error": error}, headers=headers)


async def validation_error_handler(request: Request, exc: Exception) -> Response:
    """Under /v1, OpenAI's shape and status for bad parameters (400 invalid_request_error),
    so SDK users get a BadRequestError naming the parameter; elsewhere FastAPI's 422."""
    assert isinstance(exc, RequestValidationError)
    if not request.url.path.startswith("/v1/"):
        return await request_validation_exception_handler(request, exc)
    first = exc.errors()[0] if exc.errors() else {}
    param = ".".join(str(part) for part in first.get("loc", ())[1:]) or None
    message = f"{param}: {first.get('msg', 'invalid')}" if param else first.get("msg", "invalid")
    return JSONResponse(status_code=400, content={"error": {
        "message": message, "type": "invalid_request_error", "param": param, "code": None}})


async def outage_handler(request: Request, exc: Exception) -> JSONResponse:
    """PostgreSQL or Redis away: 503 with what to check, as for any ServiceUnavailable,
    rather than a 500 with a driver's traceback (the route is asked again later)."""
    if isinstance(exc, RedisConnectionError | RedisTimeoutError):
        unavailable = ServiceUnavailable(
            f"Redis unreachable ({exc.__class__.__name__}); check QUOTAFLOW_BROKER_URL "
            "(and QUOTAFLOW_REDIS_URL) and that Redis is running")
        return await quotaflow_error_handler(request, unavailable)
    try:
        with translate_db_errors():
            raise exc
    except QuotaflowError as translated:
        return await quotaflow_error_handler(request, translated)


def install(app: FastAPI) -> None:
    app.add_exception_handler(QuotaflowError, quotaflow_error_handler)
    for outage in (OperationalError, RedisConnectionError, RedisTimeoutError):
        app.add_exception_handler(outage, outage_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
