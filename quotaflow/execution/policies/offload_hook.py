"""Provider-batch offload as a hook: a bulk job's lines whose route names a provider
batch deployment are queued for it (quotaflow/offload/enqueue.py), not called.

Only bulk runs of workers that run the poll loop (Celery) get it, and only where some
deployment is a batch one; the lines that came back from a provider batch go on to
the route's realtime deployments (execution/routes.py narrows the route after this).
"""

from sqlalchemy.orm import Session, sessionmaker

from quotaflow.deployments.catalog import Deployments, Route
from quotaflow.execution.batch import BatchRun
from quotaflow.execution.hooks import BatchHook
from quotaflow.offload import enqueue
from quotaflow.providers.capabilities import serves
from quotaflow.results.leases import ClaimedItem


class OffloadHook(BatchHook):
    def __init__(self, sessions: sessionmaker[Session], deployments: Deployments) -> None:
        self.sessions = sessions
        self.deployments = deployments

    def before_admission(self, run: BatchRun, route: Route,
                         items: list[ClaimedItem]) -> list[ClaimedItem]:
        """Queue the lines for the route's batch deployment; those left to call now (all,
        where it has none or it cannot serve the endpoint; else those that fell back)."""
        target = route.batch_deployment(self.deployments)
        if target is None or not serves(target, run.url):
            return items  # e.g. Message Batches answer chat only: realtime decides
        job_id = run.ref.job_id
        back = enqueue.fell_back(self.sessions, job_id, [item.line_no for item in items])
        enqueue.enqueue(self.sessions, job_id, run.owner, run.url, target,
                        [item for item in items if item.line_no not in back])
        return [item for item in items if item.line_no in back]
