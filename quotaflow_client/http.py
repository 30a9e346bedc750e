"""A small client for quotaflow's REST API, translating HTTP failures into QuotaflowError.

The one HTTP client: the CLI's commands (cli/) and the Python client (quotaflow.Client)
both send through it, so retries, the Idempotency-Key and the errors' wording are the
same from a shell and from a program."""

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
from httpx_sse import ServerSentEvent, SSEError, connect_sse

from quotaflow.config import Settings
from quotaflow.constants import FINAL_STATUSES as FINAL
from quotaflow.errors import (
    AuthenticationError,
    FileTooLarge,
    InvalidRequest,
    JobStateError,
    NotFound,
    PermissionDenied,
    QuotaflowError,
    ServiceUnavailable,
)
from quotaflow_client.uploads import Counted

IDEMPOTENCY_HEADER = "Idempotency-Key"
JSONL = "application/jsonl"
SUBMIT_ATTEMPTS = 3
# Answers worth sending the same upload again for: the key makes it safe.
RETRY_STATUSES = (502, 503, 504)
# The API's 4xx answers as the errors the API raised for them; any other 4xx is
# an InvalidRequest.
ERROR_BY_STATUS: dict[int, type[QuotaflowError]] = {
    403: PermissionDenied, 404: NotFound, 409: JobStateError, 413: FileTooLarge}
# Tries at the event stream before `watch_job` gives up; the stream's keep-alive comes
# every QUOTAFLOW_EVENTS_KEEPALIVE_S (15 s), so a minute of silence is a broken stream.
STREAM_ATTEMPTS = 5
STREAM_READ_TIMEOUT_S = 60.0


class _NoEventStream(Exception):
    """The API has no GET /jobs/{id}/events (an older one): poll instead."""


def new_idempotency_key() -> str:
    """One per `quotaflow submit`, reused by its own retries."""
    return f"qf-submit-{uuid.uuid4().hex}"


class ApiClient:
    def __init__(self, base_url: str, timeout: float = 60.0, api_key: str | None = None,
                 submit_timeout: float = 1800.0) -> None:
        """`api_key`: QUOTAFLOW_API_KEY's value (from_settings reads it)."""
        # QUOTAFLOW_API_KEY, sent as OpenAI clients send theirs; never logged.
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=base_url, timeout=timeout, headers=headers)
        self._base_url = base_url
        self._timeout = timeout
        self._submit_timeout = submit_timeout

    @classmethod
    def from_settings(cls, settings: Settings, submit_timeout: float | None = None,
                      ) -> "ApiClient":
        """The API at QUOTAFLOW_API_URL with the key QUOTAFLOW_API_KEY."""
        key = settings.api_key.get_secret_value() if settings.api_key else None
        return cls(settings.api_url, api_key=key,
                   submit_timeout=submit_timeout or settings.submit_timeout_s)

    def close(self) -> None:
        self._http.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ServiceUnavailable(self._failure(exc)) from exc
        _raise_for_error(response)
        return response

    def _failure(self, exc: httpx.TransportError) -> str:
        """What went wrong, in words: an API that is busy is not an unreachable one."""
        if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
            return (f"cannot reach the quotaflow API at {self._base_url} "
                    f"({exc.__class__.__name__}); start it with `quotaflow api` or set "
                    "QUOTAFLOW_API_URL")
        if isinstance(exc, httpx.ReadTimeout | httpx.WriteTimeout):
            return f"the quotaflow API at {self._base_url} is busy: no answer in time"
        return (f"the connection to the quotaflow API at {self._base_url} broke "
                f"({exc.__class__.__name__})")

    def create_job(self, path: Path, queue: str, metadata: str | None,
                   max_attempts: int | None = None, *, idempotency_key: str | None = None,
                   attempts: int = SUBMIT_ATTEMPTS, output_format: str | None = None,
                   dedup: bool | None = None,
                   on_retry: Callable[[str], None] | None = None,
                   filename: str | None = None,
                   on_sent: Callable[[int], None] | None = None,
                   caps: tuple[int | None, int | None] = (None, None)) -> dict[str, Any]:
        """Upload the file as a job. The API answers once it has stored the whole file, so
        the answer may take minutes (the submit timeout); when it does not come, or the
        connection breaks, or the API says it is unavailable, the same upload is sent
        again with the same Idempotency-Key, which gets the job the first one made
        rather than a second job."""
        key = idempotency_key or new_idempotency_key()
        given = {"metadata": metadata or None, "max_attempts": max_attempts,
                 "output_format": output_format,
                 "dedup": None if dedup is None else "true" if dedup else "false",
                 "max_rpm": caps[0], "max_tpm": caps[1]}
        options = {"queue": queue, "filename": (filename or path.name)[:255]} | {
            name: str(value) for name, value in given.items() if value is not None}
        timeout = httpx.Timeout(self._timeout, read=self._submit_timeout,
                                write=self._submit_timeout)
        for attempt in range(1, attempts + 1):
            try:
                with path.open("rb") as handle:
                    # The file as the body (POST /jobs/jsonl): the API stores its lines
                    # as they arrive, where a form is received whole first.
                    response = self._http.post(
                        "/jobs/jsonl", params=options,
                        content=handle if on_sent is None else Counted(handle, on_sent),
                        headers={IDEMPOTENCY_HEADER: key, "Content-Type": JSONL},
                        timeout=timeout)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                if attempt == 1:
                    raise ServiceUnavailable(self._failure(exc)) from exc
                reason = self._failure(exc)
            except httpx.ReadTimeout:
                reason = (f"the quotaflow API is busy: no answer within "
                          f"{self._submit_timeout:g} s of sending the file")
            except httpx.TransportError as exc:
                reason = self._failure(exc)
            else:
                if response.status_code not in RETRY_STATUSES:
                    _raise_for_error(response)
                    return _object(response)
                reason = f"the quotaflow API is unavailable (HTTP {response.status_code})"
            if attempt < attempts:
                if on_retry is not None:
                    on_retry(f"{reason}; sending the file again with the same Idempotency-Key "
                             f"(attempt {attempt + 1} of {attempts})")
                time.sleep(min(2.0 ** (attempt - 1), 10.0))
        raise ServiceUnavailable(
            f"{reason} ({attempts} attempts). The API may still make the job: "
            f"`quotaflow submit {filename or path} ... --idempotency-key {key}` returns it "
            "once it exists, "
            "without making a second one")

    def estimate(self, path: Path, queue: str) -> dict[str, Any]:
        """The file's estimate (POST /jobs?dry_run=true): the same upload as a job, stored
        nowhere, so sending it again after a timeout needs no key."""
        timeout = httpx.Timeout(self._timeout, read=self._submit_timeout,
                                write=self._submit_timeout)
        with path.open("rb") as handle:
            return _object(self._request(
                "POST", "/jobs", params={"dry_run": "true"},
                files={"file": (path.name, handle)}, data={"queue": queue}, timeout=timeout))

    def get_job(self, job_id: str) -> dict[str, Any]:
        return _object(self._request("GET", f"/jobs/{job_id}"))

    def watch_job(self, job_id: str, poll_s: float = 1.0) -> Iterator[dict[str, Any]]:
        """The job's states until a final one: from its event stream (GET
        /jobs/{id}/events, reconnecting where it left off), or, from an API without one,
        from a read every `poll_s` seconds."""
        last_id: str | None = None
        for attempt in range(1, STREAM_ATTEMPTS + 1):
            try:
                for event in self._job_events(job_id, last_id):
                    last_id = event.id or last_id
                    job = event.json()
                    yield job
                    if job["status"] in FINAL:
                        return
                return  # 204: the last state sent was the final one
            except _NoEventStream:
                break
            except (httpx.TransportError, SSEError) as exc:
                if attempt == STREAM_ATTEMPTS:
                    raise ServiceUnavailable(self._failure(exc) if isinstance(
                        exc, httpx.TransportError) else str(exc)) from exc
                time.sleep(poll_s)
        while True:
            job = self.get_job(job_id)
            yield job
            if job["status"] in FINAL:
                return
            time.sleep(poll_s)

    def _job_events(self, job_id: str, last_id: str | None) -> Iterator[ServerSentEvent]:
        headers = {"Last-Event-ID": last_id} if last_id else {}
        with connect_sse(self._http, "GET", f"/jobs/{job_id}/events", headers=headers,
                         timeout=httpx.Timeout(self._timeout, read=STREAM_READ_TIMEOUT_S),
                         ) as source:
            if source.response.status_code in (404, 405):  # an API older than the stream
                raise _NoEventStream
            if source.response.status_code == 204:
                return
            if source.response.status_code >= 400:
                source.response.read()
                _raise_for_error(source.response)
            for event in source.iter_sse():
                if event.event == "job":
                    yield event
        raise httpx.RemoteProtocolError("the event stream ended before a final status")

    def job_bound(self, job_id: str) -> dict[str, Any]:
        """What bound the job and what would make it faster (quotaflow/observe/bound.py)."""
        return _object(self._request("GET", f"/jobs/{job_id}/bound"))

    def list_jobs(self, limit: int) -> list[dict[str, Any]]:
        return _data(self._request("GET", "/jobs", params={"limit": limit}))

    def cancel_job(self, job_id: str) -> dict[str, Any]:
        return _object(self._request("POST", f"/jobs/{job_id}/cancel"))

    def delete_job(self, job_id: str) -> dict[str, Any]:
        return _object(self._request("DELETE", f"/jobs/{job_id}"))

    def retry_job(self, job_id: str) -> dict[str, Any]:
        return _object(self._request("POST", f"/jobs/{job_id}/retry"))

    def limits(self, name: str | None) -> list[dict[str, Any]]:
        if name:
            return [_object(self._request("GET", f"/limits/{name}"))]
        return _data(self._request("GET", "/limits"))

    def report(self, job_id: str) -> str:
        """The job's report page (GET /jobs/{id}/report), HTML."""
        return self._request("GET", f"/jobs/{job_id}/report").text

    def create_webhook(self, url: str, events: list[str] | None) -> dict[str, Any]:
        """Register an endpoint: the answer holds its signing secret, this once."""
        return _object(self._request("POST", "/webhooks", json={"url": url, "events": events}))

    def list_webhooks(self) -> list[dict[str, Any]]:
        return _data(self._request("GET", "/webhooks"))

    def remove_webhook(self, endpoint_id: str) -> dict[str, Any]:
        return _object(self._request("DELETE", f"/webhooks/{endpoint_id}"))

    def webhook_deliveries(self, endpoint_id: str | None, limit: int) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": limit}
        if endpoint_id:
            params["endpoint"] = endpoint_id
        return _data(self._request("GET", "/webhooks/deliveries", params=params))

    def audit_events(self, tenant: str | None, limit: int) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": limit}
        if tenant:
            params["tenant"] = tenant
        return _data(self._request("GET", "/audit", params=params))

    def stream_lines(self, job_id: str, errors: bool) -> Iterator[bytes]:
        path = f"/jobs/{job_id}/{'errors' if errors else 'results'}"
        try:
            with self._http.stream("GET", path) as response:
                if response.status_code >= 400:
                    response.read()
                    _raise_for_error(response)
                yield from response.iter_bytes()
        except httpx.TransportError as exc:
            raise ServiceUnavailable(self._failure(exc)) from exc

    def output_lines(self, job_id: str, errors: bool) -> Iterator[dict[str, Any]]:
        """The job's result (or error) lines, parsed one at a time as they arrive."""
        pending = b""
        for chunk in self.stream_lines(job_id, errors):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if line.strip():
                    yield orjson.loads(line)
        if pending.strip():
            yield orjson.loads(pending)


def _object(response: httpx.Response) -> dict[str, Any]:
    """The answer's JSON object."""
    body: dict[str, Any] = response.json()
    return body


def _data(response: httpx.Response) -> list[dict[str, Any]]:
    """The objects of a list answer (its "data")."""
    data: list[dict[str, Any]] = response.json()["data"]
    return data


def _raise_for_error(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        error = response.json().get("error") or {}
    except ValueError:
        error = {}
    message = error.get("message") or response.text or response.reason_phrase
    lines = [f"  line {d['line']}: {d['message']}" for d in error.get("data", [])[:20]]
    text = "\n".join([message, *lines])
    if response.status_code == 401:
        raise AuthenticationError(f"{text}\n(set QUOTAFLOW_API_KEY to a key from "
                                  "`quotaflow keys create`)")
    if response.status_code >= 500:
        raise ServiceUnavailable(f"the quotaflow API failed (HTTP {response.status_code}): {text}")
    raise ERROR_BY_STATUS.get(response.status_code, InvalidRequest)(text)
