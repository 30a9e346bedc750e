"""Every error quotaflow raises on purpose.

    QuotaflowError
    ├── ConfigError            settings or deployments file are unusable
    ├── InvalidRequest         the request itself cannot be used as given (HTTP 400)
    │   ├── InvalidParameter   one parameter of a request is unusable (it is named)
    │   │   └── Untranslatable one field has no equivalent at the deployment's provider family
    │   ├── InputFileError     an uploaded JSONL file is rejected as a whole
    │   │   └── ModelNotAllowed a batch names a model its key or tenant may not use
    │   ├── TableError         a table (CSV, Parquet, JSONL rows) cannot be read or used
    │   │   └── RowError       one row cannot become a request (its row and column named)
    │   ├── TemplateError      a prompt template does not compile
    │   ├── StorageError       an s3://, gs:// or az:// object cannot be read or written
    │   ├── FileTooLarge       an upload is over QUOTAFLOW_MAX_UPLOAD_BYTES (HTTP 413)
    │   └── RequestTooLarge    a request costs more tokens than its deployment ever admits
    ├── NotFound               no such object, or not the caller's tenant's (HTTP 404)
    │   ├── JobNotFound        no job with that id
    │   ├── FileNotFound       no file with that id
    │   ├── ResultsDeleted     a job's results were deleted or expired (it is a tombstone)
    │   └── DeploymentNotFound no deployment with that name
    ├── AuthenticationError    no API key, or one quotaflow does not know
    │   └── KeyExpired         a key past its expiry, or a rotated key past its grace
    ├── PermissionDenied       a known key without the operator flag a route needs
    │   └── ScopeDenied        a key whose scope (read, submit, admin) is below the route's
    ├── EnqueuedTokenLimit     a batch would take its tenant over its token quota
    ├── SpendLimitExceeded     a batch may cost more than its tenant has left this month
    ├── JobStateError          the job is in a state that forbids the action
    ├── ProviderError          a provider call failed
    │   ├── RetryableProviderError   429, 5xx, timeouts, connection errors
    │   └── PermanentProviderError   other 4xx: retrying cannot help
    │       └── UnservedContent      a content part the deployment's model cannot take
    └── ServiceUnavailable     Redis, Postgres or the REST API cannot be reached
        └── NotConfigured      a feature the operator has not set up (webhooks' key)

Messages are written for the person who has to act on them.
"""

from dataclasses import dataclass, field
from typing import Any


class QuotaflowError(Exception):
    """Root of quotaflow's own errors; the CLI and API show their message as is."""


class ConfigError(QuotaflowError):
    """The settings or the deployments file cannot be used as given."""


class EngineStopped(QuotaflowError):
    """A local engine was shut down (or its processes ended) while it held a request: not
    the request's fault, so its item is handed back to run again, never failed."""


class InvalidRequest(QuotaflowError):
    """The request itself cannot be used as given: sending it again unchanged cannot help."""


class NotFound(QuotaflowError):
    """No object has the given id or name, or it belongs to another tenant."""


@dataclass
class LineProblem:
    """One rejected input line: where it is and why it was refused."""

    line_no: int
    reason: str


@dataclass
class InputFileError(InvalidRequest):
    """The input file as a whole is refused; nothing of it was stored."""

    message: str
    problems: list[LineProblem] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__(self.message)

    def __str__(self) -> str:
        shown = [f"  line {p.line_no}: {p.reason}" for p in self.problems[:20]]
        more = len(self.problems) - len(shown)
        if more > 0:
            shown.append(f"  ... and {more} more")
        return "\n".join([self.message, *shown])


class ModelNotAllowed(InputFileError):
    """A batch validated as a whole (OpenAI's Batch API, Message Batches) names a model
    its key or tenant may not use: refused before anything is stored, naming the lines."""


class TableError(InvalidRequest):
    """A table given as input (or to join answers to) cannot be read or used as given:
    an unreadable file, an unknown format, a missing id column. Nothing was submitted."""


class RowError(TableError):
    """One row of a table cannot become a request: `row` is its number (1 for the first
    row after a header) and `column` the column at fault, where one is."""

    def __init__(self, row: int, column: str | None, message: str) -> None:
        where = f"row {row}" + (f", column {column!r}" if column else "")
        super().__init__(f"{where}: {message}")
        self.row = row
        self.column = column


class TemplateError(InvalidRequest):
    """A prompt template does not compile (its syntax), so no row was rendered."""


class StorageError(InvalidRequest):
    """An object storage path (s3://, gs://, az://) cannot be used: an unknown scheme, a
    missing object, refused credentials, its library not installed. The message names
    the path; nothing was submitted or written."""


class InvalidParameter(InvalidRequest):
    """One parameter of a request cannot be used; `param` names it, so an API client (the
    OpenAI SDK's `error.param`) can tell which without parsing the message."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


class Untranslatable(InvalidParameter):
    """A request field has no faithful equivalent in the other provider family's API (an
    OpenAI chat body going to Anthropic's Messages API, or back): the line fails naming
    the field rather than being sent without it (quotaflow/providers/translate/)."""


class JobNotFound(NotFound):
    """No job has the given id."""


class FileNotFound(NotFound):
    """No file has the given id, or it belongs to another tenant."""


class ResultsDeleted(NotFound):
    """The job exists, but its results were deleted, on request or when they expired
    (quotaflow/compat/retention.py): what is gone is "not found", as an expired file at OpenAI."""


class FileTooLarge(InvalidRequest):
    """An upload is larger than QUOTAFLOW_MAX_UPLOAD_BYTES; nothing of it is kept."""


class RequestTooLarge(InvalidRequest):
    """The request costs more tokens than the deployment's bucket can ever hold."""


class AuthenticationError(QuotaflowError):
    """The request carries no API key, or a key that is unknown or revoked."""


class KeyExpired(AuthenticationError):
    """The key was valid until its expiry (or, rotated, the end of its grace period)."""


class PermissionDenied(QuotaflowError):
    """The key is valid but lacks the scope the action needs (operator routes)."""


class ScopeDenied(PermissionDenied):
    """The key's scope is below what the route needs; both are named, in the message and
    as `have` / `needed`."""

    def __init__(self, message: str, *, have: str, needed: str) -> None:
        super().__init__(message)
        self.have = have
        self.needed = needed


class EnqueuedTokenLimit(QuotaflowError):
    """A new batch would take its tenant's unfinished batches over their token quota."""


class SpendLimitExceeded(QuotaflowError):
    """A new batch may cost more than what is left of its tenant's monthly spend limit."""


class DeploymentNotFound(NotFound):
    """No deployment in the deployments file has the given name."""


class JobStateError(QuotaflowError):
    """The job's status does not allow the requested action."""


class ProviderError(QuotaflowError):
    """A provider call failed; status_code is None for transport failures."""

    def __init__(
        self,
        message: str,
        status_code: int | None = None,
        retry_after: float | None = None,
        body: dict[str, Any] | None = None,
        remaining: tuple[float | None, float | None] = (None, None),
        remaining_input: float | None = None,
        request_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.retry_after = retry_after
        self.body = body
        # The provider's x-ratelimit-remaining-requests and -tokens, where it sent them.
        self.remaining = remaining
        # A split budget's input tokens left (Anthropic's ITPM); remaining's tokens are
        # then the output tokens'.
        self.remaining_input = remaining_input
        # The provider's id of the call that failed, where it answered with one: what its
        # support asks for, on the error's log line.
        self.request_id = request_id


class RetryableProviderError(ProviderError):
    """Rate limited, overloaded, timed out or disconnected: worth another try."""


class PermanentProviderError(ProviderError):
    """The provider refused the request itself (4xx): another try gives the same."""


class UnservedContent(PermanentProviderError):
    """A content part (an image, audio, a file) the deployment's model cannot take: the
    line fails naming the part's type, where it is and the deployment, rather than being
    answered from its text alone (quotaflow/providers/local/content.py). A 400 in
    OpenAI's error shape, with the part's path as `param`."""

    def __init__(self, deployment: str, part_type: str, param: str, why: str) -> None:
        message = (f"{param}: deployment {deployment!r} cannot serve a {part_type!r} part "
                   f"({why}); remove the part, or route the model to a deployment that "
                   "takes it")
        super().__init__(message, status_code=400, body={"error": {
            "message": message, "type": "invalid_request_error", "param": param,
            "code": "unsupported_content"}})
        self.deployment = deployment
        self.part_type = part_type
        self.param = param


class ServiceUnavailable(QuotaflowError):
    """A service quotaflow depends on (Redis, Postgres, the REST API) is unreachable."""


class NotConfigured(ServiceUnavailable):
    """A part of quotaflow its operator has not set up (webhooks without their key): the
    request is fine, this server cannot serve it until a setting is given."""
