"""quotaflow: batch LLM processing on one exact, cluster-wide provider budget.

`from quotaflow import Client` (and AsyncClient, Job) names the Python client, which
stands beside this package (quotaflow_client/); it is imported on first use, so the
workers and the API, which import quotaflow's modules, never load it.
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["AsyncClient", "AsyncJob", "Client", "Job", "__version__"]


def __getattr__(name: str) -> Any:
    if name in ("AsyncClient", "AsyncJob", "Client", "Job"):
        import quotaflow_client

        return getattr(quotaflow_client, name)
    raise AttributeError(f"module 'quotaflow' has no attribute {name!r}")
