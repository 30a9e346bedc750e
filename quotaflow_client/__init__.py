"""quotaflow's Python client (`from quotaflow import Client`): jobs submitted from files,
tables or a program's rows, followed, read, cancelled and retried, over HTTP to a
running API or in this process on the embedded defaults. It stands beside the domain,
as cli/ does, and the CLI's commands send through the same HTTP client
(quotaflow_client/http.py) and the same in-process engine (quotaflow_client/embedded.py).
Its modules are imported on first use: a CLI command that only sends a request through
the HTTP client does not load pyarrow or the in-process engine.
"""

from typing import Any

__all__ = ["AsyncClient", "AsyncJob", "Client", "Job"]


def __getattr__(name: str) -> Any:
    if name in ("Client", "Job"):
        from quotaflow_client import client

        return getattr(client, name)
    if name in ("AsyncClient", "AsyncJob"):
        from quotaflow_client import aio

        return getattr(aio, name)
    raise AttributeError(f"module 'quotaflow_client' has no attribute {name!r}")
