"""The metrics tally as a hook (quotaflow/observe/metrics.py): admissions and provider answers
counted in plain integers, written to Prometheus with each feedback settle and at the
run's end. Every run of a process whose counts are served gets it (a worker started
with a metrics port, workers/metrics.py); elsewhere nothing would read them.

The hook is the Tally itself, and its `call_ended` point is Tally.answered: the one
per-request point costs no call beyond the count.
"""

from collections.abc import Sequence

from quotaflow.execution.admitted import Admitted
from quotaflow.execution.batch import BatchRun
from quotaflow.execution.hooks import BatchHook
from quotaflow.observe.metrics import Tally


class MetricsHook(Tally, BatchHook):
    """Tally's methods come first: its flush() is the hook's `flush`."""

    call_ended = Tally.answered

    def chunk_admitted(self, entries: Sequence[Admitted], waited_s: float) -> None:
        self.admitted(entries[0].deployment.name, len(entries), sum(a.cost for a in entries),
                      waited_s)

    def retry_admitted(self, entry: Admitted, waited_s: float) -> None:
        self.admitted(entry.deployment.name, 1, entry.cost, waited_s)

    def on_stop(self, run: BatchRun) -> None:
        self.flush()

