"""Cross-job reuse as a hook: claimed items whose identical request an earlier job of
the tenant already got a successful answer for take that answer (quotaflow/results/reuse.py)
and are never called. One query per run, only where QUOTAFLOW_DEDUP_ACROSS_JOBS is on.
"""

from sqlalchemy.orm import Session, sessionmaker

from quotaflow.execution.batch import BatchRun
from quotaflow.execution.hooks import BatchHook
from quotaflow.results.leases import ClaimedItem
from quotaflow.results.reuse import earlier_answers


class ReuseHook(BatchHook):
    def __init__(self, sessions: sessionmaker[Session], tenant: str) -> None:
        self.sessions = sessions
        self.tenant = tenant

    def claimed(self, run: BatchRun, items: list[ClaimedItem]) -> list[ClaimedItem]:
        reused = earlier_answers(self.sessions, run.ref.job_id, self.tenant, items,
                                 run.output_format)
        if not reused:
            return items
        left = []
        for item in items:
            if item.line_no in reused:
                run.finish(item, reused[item.line_no])
            else:
                left.append(item)
        return left
