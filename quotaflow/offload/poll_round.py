"""The poll loop's round: gather queued lines into provider batches, then move every due
provider batch one step: upload, poll (passing on cancel, expiry and a window about to
be missed), collect.

Every worker runs it in a thread of its main process (workers/offload.py), as it runs the
webhook deliverer. Claims are SKIP LOCKED and move the batch's next_poll_at a lease
(QUOTAFLOW_PROVIDER_BATCH_LEASE_S) ahead, so any number of workers poll together
without doing a step twice, and a worker killed mid-step leaves a claim that lapses:
the next worker repeats the step. Each step is safe to repeat: an upload whose id was
not stored is found again by our id where the provider keeps metadata (clients.py),
a cancel asked twice is harmless, and results are insert-or-ignore.
"""

import logging
from datetime import timedelta

import orjson
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.config import Settings
from quotaflow.deployments.catalog import Deployments
from quotaflow.deployments.deployment import Deployment
from quotaflow.dispatch.queues import Dispatcher
from quotaflow.errors import PermanentProviderError, ProviderError, Untranslatable
from quotaflow.models import Job, utcnow
from quotaflow.offload.batch_tables import BatchState, ProviderBatch
from quotaflow.offload.clients import BatchClient, Remote, make_client
from quotaflow.offload.collect import Collector, OffloadedJob
from quotaflow.offload.gather import gather
from quotaflow.offload.results import LineResult, read_line
from quotaflow.providers.outcomes import Failure, FailureCode

log = logging.getLogger(__name__)
BATCHES = ProviderBatch.__table__
CLAIM_LIMIT = 16


class ProviderBatchLoop:
    """One worker's poller; `round` is called every QUOTAFLOW_PROVIDER_BATCH_POLL_S / 2."""

    def __init__(self, sessions: sessionmaker[Session], deployments: Deployments,
                 settings: Settings, dispatcher: Dispatcher) -> None:
        self.sessions = sessions
        self.deployments = deployments
        self.settings = settings
        self.collector = Collector(sessions, deployments, dispatcher, settings.batch_size,
                                   timedelta(seconds=settings.queue_patience_s))
        self._clients: dict[str, BatchClient] = {}

    def round(self) -> int:
        """Gather, then one step of every due provider batch; how many were stepped."""
        made = gather(self.sessions, self.deployments, self.settings.provider_batch_gather_s)
        if made:
            log.info("provider batches: %d made from queued lines", made)
        claimed = self._claim_due()
        for batch in claimed:
            try:
                self.step(batch)
            except ProviderError as exc:  # the provider is away: the same step next round
                log.warning("provider batch %s (%s): %s; trying again in %.1fs", batch.id,
                            batch.provider_id, exc, self.settings.provider_batch_poll_s,
                            extra={"job_id": batch.job_id})
                self._save(batch.id, error=str(exc)[:1000])
            except Exception:  # one batch's trouble must not hold up the others
                log.exception("provider batch %s: step failed; its claim lapses and it is "
                              "tried again", batch.id, extra={"job_id": batch.job_id})
        return len(claimed)

    def step(self, batch: ProviderBatch) -> None:
        job = self._job(batch.job_id)
        if job is None:  # the job was deleted: nothing is left to store its results in
            if batch.state == BatchState.SUBMITTED and batch.provider_id:
                self._client(batch.deployment).cancel(batch.provider_id)
            self._save(batch.id, state=BatchState.DONE, error="its job no longer exists")
            return
        if batch.state == BatchState.UPLOADING:
            self._upload(batch, job)
        elif batch.state == BatchState.SUBMITTED:
            self._poll(batch, job)
        elif batch.state == BatchState.COLLECTING:
            self._collect(batch, job)

    def _upload(self, batch: ProviderBatch, job: OffloadedJob) -> None:
        items = self.collector.held(batch)
        if job.ended is not None or self._window_closing(job) or not items:
            # Nothing sent yet: the lines end with their job, or go to realtime.
            self.collector.settle(job, items, [LineResult(n, "expired", None, True)
                                               for n in items])
            self._save(batch.id, state=BatchState.DONE, ended_at=utcnow())
            return
        client = self._client(batch.deployment)
        found = client.find(batch.id, batch.created_at)
        if found is not None:
            log.info("provider batch %s found again at the provider as %s", batch.id, found)
            self._save(batch.id, state=BatchState.SUBMITTED, provider_id=found,
                       submitted_at=utcnow())
            return
        lines, refused = [], []
        for n, item in items.items():
            try:
                lines.append(_line(client.request_line(n, job.url, item.body)))
            except Untranslatable as exc:  # that line fails (or goes to realtime), not all
                refused.append(LineResult(n, "errored", Failure(
                    FailureCode.INVALID_REQUEST, f"deployment {batch.deployment!r}: {exc}"),
                    False))
        if refused:
            self.collector.settle(job, {r.line_no: items.pop(r.line_no) for r in refused},
                                  refused)
            if not lines:
                self._save(batch.id, state=BatchState.DONE, ended_at=utcnow())
                return
        body = b"".join(lines)
        try:
            provider_id, file_id = client.submit(batch.id, job.url, body)
        except PermanentProviderError as exc:  # refused whole: each line as a call would be
            failure = Failure(FailureCode.PROVIDER_ERROR, f"provider batch refused: {exc}",
                              exc.status_code, exc.body, 1)
            self.collector.settle(job, items, [LineResult(n, "errored", failure, True)
                                               for n in items])
            self._save(batch.id, state=BatchState.DONE, error=str(exc)[:1000],
                       ended_at=utcnow())
            return
        log.info("provider batch %s: %d lines of job %s uploaded to %s as %s", batch.id,
                 len(items), job.id, batch.deployment, provider_id, extra={"job_id": job.id})
        self._save(batch.id, state=BatchState.SUBMITTED, provider_id=provider_id,
                   input_file_id=file_id, submitted_at=utcnow())

    def _poll(self, batch: ProviderBatch, job: OffloadedJob) -> None:
        client = self._client(batch.deployment)
        assert batch.provider_id is not None
        reason = job.ended or ("window" if self._window_closing(job) else None)
        if reason is not None and batch.cancel_reason is None:
            client.cancel(batch.provider_id)
            log.info("provider batch %s (%s) cancelled: %s", batch.id, batch.provider_id,
                     reason, extra={"job_id": job.id})
            self._save(batch.id, cancel_reason=reason)
        remote = client.retrieve(batch.provider_id)
        if not remote.ended:
            self._save(batch.id, provider_status=remote.status)
            return
        self._save(batch.id, state=BatchState.COLLECTING, provider_status=remote.status,
                   ended_at=utcnow(), error=remote.errors)
        batch.ended_at = utcnow()
        self._collect(batch, job, remote)

    def _collect(self, batch: ProviderBatch, job: OffloadedJob,
                 remote: Remote | None = None) -> None:
        client = self._client(batch.deployment)
        assert batch.provider_id is not None
        remote = remote or client.retrieve(batch.provider_id)
        deployment = self.deployments.deployments[batch.deployment]
        results = (r for raw in client.results(remote)
                   if (r := read_line(raw, deployment.provider)) is not None)
        unrun = {"completed": "errored", "failed": "errored"}.get(remote.outcome or "",
                                                                  remote.outcome or "errored")
        self.collector.collect(batch, job, results, unrun)
        log.info("provider batch %s (%s) of job %s: results stored", batch.id,
                 batch.provider_id, job.id, extra={"job_id": job.id})
        self._save(batch.id, state=BatchState.DONE)

    def _window_closing(self, job: OffloadedJob) -> bool:
        """The job's window ends within the margin: its lines had better go realtime."""
        margin = timedelta(seconds=self.settings.provider_batch_window_margin_s)
        return job.expires_at is not None and job.expires_at - margin <= utcnow()

    def _claim_due(self) -> list[ProviderBatch]:
        now = utcnow()
        lease = now + timedelta(seconds=self.settings.provider_batch_lease_s)
        with self.sessions.begin() as session:
            batches = list(session.scalars(
                select(ProviderBatch)
                .where(ProviderBatch.state.in_(BatchState.OPEN), ProviderBatch.next_poll_at <= now)
                .order_by(ProviderBatch.next_poll_at).limit(CLAIM_LIMIT)
                .with_for_update(skip_locked=True)))
            for batch in batches:
                batch.next_poll_at = lease
            session.flush()
            session.expunge_all()
        return batches

    def _save(self, batch_id: str, **values: object) -> None:
        """Record a step, and when the batch is due again (the next poll)."""
        due = utcnow() + timedelta(seconds=self.settings.provider_batch_poll_s)
        with self.sessions.begin() as session:
            session.execute(update(BATCHES).where(BATCHES.c.id == batch_id)
                            .values(next_poll_at=due, **values))

    def _job(self, job_id: str) -> OffloadedJob | None:
        with self.sessions() as session:
            row = session.execute(select(Job.id, Job.status, Job.queue, Job.endpoint,
                                         Job.tenant, Job.output_format, Job.expires_at,
                                         Job.stop_reason)
                                  .where(Job.id == job_id)).one_or_none()
        return None if row is None else OffloadedJob(*row)

    def _client(self, name: str) -> BatchClient:
        client = self._clients.get(name)
        if client is None:
            deployment: Deployment = self.deployments.deployments[name]
            client = self._clients[name] = make_client(deployment)
        return client

    def close(self) -> None:
        for client in self._clients.values():
            client.close()


def _line(request: dict[str, object]) -> bytes:
    return orjson.dumps(request) + b"\n"
