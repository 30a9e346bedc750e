"""The CLI's HTTP client is the shared one (quotaflow_client/http.py); this name stays for
the commands and tests that import it from here."""

from quotaflow_client.http import (
    ERROR_BY_STATUS,
    IDEMPOTENCY_HEADER,
    ApiClient,
    _raise_for_error,
    new_idempotency_key,
)

__all__ = ["ERROR_BY_STATUS", "IDEMPOTENCY_HEADER", "ApiClient", "_raise_for_error",
           "new_idempotency_key"]
