"""`quotaflow run`'s engine is the shared in-process one (quotaflow_client/embedded.py),
which `quotaflow.Client.embedded()` runs too."""

from quotaflow_client.embedded import Embedded, OutputLines, run_file

__all__ = ["Embedded", "OutputLines", "run_file"]
