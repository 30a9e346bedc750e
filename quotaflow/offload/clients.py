"""The providers' Batch APIs through their official SDKs: upload, find again, poll, cancel,
and read results.

`openai-batch`: a JSONL file through POST /files (purpose "batch"), then POST /batches
with metadata {"quotaflow_batch": our id} and that id as Idempotency-Key, so a batch
whose id was never stored (a crash between the two) is found again by `find` instead of
made twice. `anthropic-batch`: POST /v1/messages/batches with the requests inline;
Message Batches have no metadata, so an upload interrupted before its id was stored is
made again (its results are stored once either way: results are insert-or-ignore); the
lines' `params.betas` become the batch's one `anthropic-beta` header, their union.
`azure-batch`: OpenAI's files and batches under an Azure resource (azure_batches.py).
The deployment's own headers and query (quotaflow/deployments/extras.py) go with every
call, read from the environment when the client is made. SDK errors become quotaflow's
retryable and permanent provider errors here.
"""

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import httpx
import orjson

from quotaflow.deployments.deployment import Deployment
from quotaflow.deployments.extras import resolve
from quotaflow.errors import PermanentProviderError, ProviderError, RetryableProviderError
from quotaflow.providers.translate.body import request_body

METADATA_KEY = "quotaflow_batch"
# How far back `find` looks through the provider's batch list for our id.
FIND_PAGES = 10
RETRYABLE = frozenset({408, 409, 429})


def custom_id(line_no: int) -> str:
    """A line's custom_id at the provider (Anthropic allows [a-zA-Z0-9_-]{1,64})."""
    return f"q{line_no}"


def line_of(custom: str | None) -> int | None:
    try:
        return int(custom[1:]) if custom and custom.startswith("q") else None
    except ValueError:
        return None


@dataclass(frozen=True)
class Remote:
    """A provider batch as the provider reports it: still running, or ended how."""

    provider_id: str
    status: str  # the provider's own word
    ended: bool
    # "completed", "cancelled", "expired" or "failed" once ended.
    outcome: str | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    results_url: str | None = None
    errors: str | None = None


class BatchClient(Protocol):
    def request_line(self, line_no: int, url: str, body: dict[str, Any]) -> dict[str, Any]:
        """The line as the provider's batch file holds it; Untranslatable where the body
        cannot go to this provider's family."""
        ...

    def find(self, batch_id: str, since: datetime) -> str | None: ...

    def submit(self, batch_id: str, url: str, lines: bytes) -> tuple[str, str | None]: ...

    def retrieve(self, provider_id: str) -> Remote: ...

    def cancel(self, provider_id: str) -> None: ...

    def results(self, remote: Remote) -> Iterator[dict[str, Any]]: ...

    def close(self) -> None: ...


def extras(deployment: Deployment) -> tuple[dict[str, str], dict[str, str]]:
    """The deployment's headers and query parameters, environment values read now."""
    return (resolve(deployment.headers, deployment.name, "header"),
            resolve(deployment.query, deployment.name, "query parameter"))


def make_client(deployment: Deployment) -> BatchClient:
    if deployment.provider == "anthropic-batch":
        return AnthropicBatches(deployment)
    if deployment.provider == "azure-batch":
        from quotaflow.offload.azure_batches import AzureBatches  # it imports this module

        return AzureBatches(deployment)
    return OpenAIBatches(deployment)


@contextlib.contextmanager
def _translated(name: str) -> Iterator[None]:
    """The SDKs' errors as quotaflow's: 5xx, 408, 409, 429 and network errors are worth
    another round; other 4xx are permanent."""
    import anthropic
    import openai

    try:
        yield
    except (openai.APIStatusError, anthropic.APIStatusError) as exc:
        status = exc.status_code
        kind = (RetryableProviderError if status in RETRYABLE or status >= 500
                else PermanentProviderError)
        raise kind(f"{name}: HTTP {status}: {exc.message}", status_code=status) from exc
    except (openai.APIError, anthropic.APIError, httpx.HTTPError) as exc:
        raise RetryableProviderError(f"{name}: {exc.__class__.__name__}: {exc}") from exc


class OpenAIBatches:
    """OpenAI's Files + Batches API (or any server speaking it: quotaflow's own /v1)."""

    def __init__(self, deployment: Deployment) -> None:
        import openai

        self.deployment = deployment
        headers, query = extras(deployment)
        self.client = openai.OpenAI(base_url=deployment.base_url,
                                    api_key=deployment.api_key() or "unused",
                                    timeout=deployment.timeout_s, max_retries=2,
                                    default_headers=headers, default_query=query)

    def request_line(self, line_no: int, url: str, body: dict[str, Any]) -> dict[str, Any]:
        return {"custom_id": custom_id(line_no), "method": "POST", "url": url,
                "body": request_body(body, self.deployment)}

    def find(self, batch_id: str, since: datetime) -> str | None:
        with _translated(self.deployment.name):
            page = self.client.batches.list(limit=100)
            for _ in range(FIND_PAGES):
                for batch in page.data:
                    if (batch.metadata or {}).get(METADATA_KEY) == batch_id:
                        return batch.id
                if not page.data or page.data[-1].created_at < since.timestamp() - 3600 \
                        or not page.has_next_page():
                    return None
                page = page.get_next_page()
        return None

    def submit(self, batch_id: str, url: str, lines: bytes) -> tuple[str, str | None]:
        with _translated(self.deployment.name):
            upload = self.client.files.create(file=(f"{batch_id}.jsonl", lines),
                                              purpose="batch")
            # The SDK types both as Literals; ENDPOINTS and the deployment's check hold them.
            batch = self.client.batches.create(
                input_file_id=upload.id, endpoint=url,  # type: ignore[arg-type]
                completion_window=self.deployment.completion_window,  # type: ignore[arg-type]
                metadata={METADATA_KEY: batch_id},
                extra_headers={"Idempotency-Key": batch_id})
        return batch.id, upload.id

    def retrieve(self, provider_id: str) -> Remote:
        with _translated(self.deployment.name):
            batch = self.client.batches.retrieve(provider_id)
        ended = batch.status in ("completed", "failed", "expired", "cancelled")
        errors = None
        if batch.errors and batch.errors.data:
            errors = "; ".join(e.message or e.code or "" for e in batch.errors.data)
        return Remote(batch.id, batch.status, ended, batch.status if ended else None,
                      batch.output_file_id, batch.error_file_id, errors=errors)

    def cancel(self, provider_id: str) -> None:
        with _translated(self.deployment.name):
            self.client.batches.cancel(provider_id)

    def results(self, remote: Remote) -> Iterator[dict[str, Any]]:
        for file_id in (remote.output_file_id, remote.error_file_id):
            if not file_id:
                continue
            with _translated(self.deployment.name), \
                    self.client.files.with_streaming_response.content(file_id) as stream:
                for line in stream.iter_lines():
                    if line.strip():
                        yield orjson.loads(line)

    def close(self) -> None:
        self.client.close()


class AnthropicBatches:
    """Anthropic's Message Batches: POST/GET /v1/messages/batches, results as JSONL."""

    def __init__(self, deployment: Deployment) -> None:
        import anthropic

        assert deployment.base_url is not None
        self.deployment = deployment
        self.key = deployment.api_key() or "unused"
        self.headers, self.query = extras(deployment)
        self.client = anthropic.Anthropic(
            base_url=deployment.base_url.rstrip("/").removesuffix("/v1"), api_key=self.key,
            timeout=deployment.timeout_s, max_retries=2,
            default_headers={"anthropic-version": deployment.anthropic_version,
                             "x-api-key": self.key, **self.headers},
            default_query=self.query)

    def request_line(self, line_no: int, url: str, body: dict[str, Any]) -> dict[str, Any]:
        return {"custom_id": custom_id(line_no), "params": request_body(body, self.deployment)}

    def find(self, batch_id: str, since: datetime) -> str | None:
        return None  # Message Batches carry no metadata to find ours by

    def submit(self, batch_id: str, url: str, lines: bytes) -> tuple[str, str | None]:
        requests = [orjson.loads(line) for line in lines.splitlines() if line]
        betas: dict[str, None] = {}  # the lines' params.betas: one header for the batch
        for request in requests:
            betas.update(dict.fromkeys(request["params"].pop("betas", None) or ()))
        headers = {"anthropic-beta": ",".join(betas)} if betas else None
        with _translated(self.deployment.name):
            batch = self.client.messages.batches.create(
                requests=requests, extra_headers=headers)
        return batch.id, None

    def retrieve(self, provider_id: str) -> Remote:
        with _translated(self.deployment.name):
            batch = self.client.messages.batches.retrieve(provider_id)
        if batch.processing_status != "ended":
            return Remote(batch.id, batch.processing_status, False)
        counts = batch.request_counts
        outcome = ("cancelled" if batch.cancel_initiated_at is not None and counts.canceled
                   else "expired" if counts.expired else "completed")
        return Remote(batch.id, batch.processing_status, True, outcome,
                      results_url=batch.results_url)

    def cancel(self, provider_id: str) -> None:
        with _translated(self.deployment.name):
            self.client.messages.batches.cancel(provider_id)

    def results(self, remote: Remote) -> Iterator[dict[str, Any]]:
        if not remote.results_url:
            return
        headers = {"x-api-key": self.key, "anthropic-version": self.deployment.anthropic_version,
                   **self.headers}
        with _translated(self.deployment.name), httpx.stream(
                "GET", remote.results_url, headers=headers, params=self.query,
                timeout=self.deployment.timeout_s) as response:
            if response.status_code >= 400:
                raise RetryableProviderError(
                    f"{self.deployment.name}: results: HTTP {response.status_code}",
                    status_code=response.status_code)
            for line in response.iter_lines():
                if line.strip():
                    yield orjson.loads(line)

    def close(self) -> None:
        self.client.close()


__all__ = ["BatchClient", "ProviderError", "Remote", "custom_id", "line_of", "make_client"]
