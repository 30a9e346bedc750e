"""A small client for quotaflow's REST API, translating HTTP failures into QuotaflowError."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from quotaflow.errors import QuotaflowError, ServiceUnavailable


class NotFound(QuotaflowError):
    """The API has no such job or deployment."""


class ApiClient:
    def __init__(self, base_url: str, timeout: float = 60.0, api_key: str | None = None) -> None:
        # QUOTAFLOW_API_KEY, sent as OpenAI clients send theirs; never logged.
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=base_url, timeout=timeout, headers=headers)
        self._base_url = base_url

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ServiceUnavailable(
                f"cannot reach the quotaflow API at {self._base_url} ({exc.__class__.__name__}); "
                "start it with `quotaflow api` or set QUOTAFLOW_API_URL") from exc
        _raise_for_error(response)
        return response

    def create_job(self, path: Path, queue: str, metadata: str | None,
                   max_attempts: int | None = None) -> dict[str, Any]:
        with path.open("rb") as handle:
            data = {"queue": queue} | ({"metadata": metadata} if metadata else {})
            if max_attempts is not None:
                data["max_attempts"] = str(max_attempts)
            return self._request("POST", "/jobs", files={"file": (path.name, handle)},
                                 data=data).json()

    def get_job(self, job_id: str) -> dict[str, Any]:
        return self._request("GET", f"/jobs/{job_id}").json()

    def list_jobs(self, limit: int) -> list[dict[str, Any]]:
        return self._request("GET", "/jobs", params={"limit": limit}).json()["data"]

    def cancel_job(self, job_id: str) -> dict[str, Any]:
        return self._request("POST", f"/jobs/{job_id}/cancel").json()

    def retry_job(self, job_id: str) -> dict[str, Any]:
        return self._request("POST", f"/jobs/{job_id}/retry").json()

    def limits(self, name: str | None) -> list[dict[str, Any]]:
        if name:
            return [self._request("GET", f"/limits/{name}").json()]
        return self._request("GET", "/limits").json()["data"]

    def stream_lines(self, job_id: str, errors: bool) -> Iterator[bytes]:
        path = f"/jobs/{job_id}/{'errors' if errors else 'results'}"
        try:
            with self._http.stream("GET", path) as response:
                if response.status_code >= 400:
                    response.read()
                    _raise_for_error(response)
                yield from response.iter_bytes()
        except httpx.TransportError as exc:
            raise ServiceUnavailable(f"lost the connection to {self._base_url}: {exc}") from exc


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
    if response.status_code == 404:
        raise NotFound(text)
    if response.status_code == 401:
        raise QuotaflowError(f"{text}\n(set QUOTAFLOW_API_KEY to a key from "
                             "`quotaflow keys create`)")
    if response.status_code >= 500:
        raise ServiceUnavailable(f"the quotaflow API failed (HTTP {response.status_code}): {text}")
    raise QuotaflowError(text)
