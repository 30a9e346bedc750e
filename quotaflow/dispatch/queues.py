"""The queue contract: what a batch message carries, who sends it, and to which queue.

A message names a job and an inclusive line range, never prompts: the items
are in PostgreSQL, so a message lost or delivered twice costs nothing (the
worker claims the lines; the reaper queues again what nobody claimed).
Job creation, retries and the reaper hand their batches to a `Dispatcher`:
Celery's (workers/dispatch.py) in a deployment, `CollectingDispatcher` for
the in-process `quotaflow run`.

Placing: a local deployment's model lives only in the workers started for it
(`quotaflow worker --deployment NAME`), so a batch whose requests route to it
must reach no other worker. PlacingDispatcher wraps any Dispatcher: it splits
each batch's line range into runs of lines placed alike and sends a run whose
model's route names a local deployment to local.NAME.PRIORITY
(quotaflow.constants.local_queue); everything else goes to the priority queue.
Every dispatch goes through it, so a batch queued again lands where it was
first sent. A route that names a local deployment and remote ones is served
wholly by the local deployment's workers (they can call the remote ones too).
"""

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy import case, select
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.constants import local_queue
from quotaflow.deployments.catalog import Deployments
from quotaflow.models import Item


@dataclass(frozen=True)
class BatchRef:
    """What a queue message carries: a job and an inclusive line range, never prompts."""

    job_id: str
    first_line: int
    last_line: int


class Dispatcher(Protocol):
    """Hands a new job's batches to whatever runs them (Celery, or in-process)."""

    def dispatch(self, queue: str, batches: list[BatchRef]) -> None: ...


def batch_refs(job_id: str, line_numbers: list[int], batch_size: int) -> list[BatchRef]:
    return [
        BatchRef(job_id, chunk[0], chunk[-1])
        for chunk in (line_numbers[i:i + batch_size]
                      for i in range(0, len(line_numbers), batch_size))
    ]


class CollectingDispatcher:
    """Keeps the batches, for a caller that runs them itself instead of queueing them."""

    def __init__(self) -> None:
        self.batches: list[BatchRef] = []

    def dispatch(self, queue: str, batches: list[BatchRef]) -> None:
        self.batches.extend(batches)


def queue_for(deployments: Deployments, route: str | None, priority: str) -> str:
    """The queue of a request with that route name: its local deployment's, if any."""
    local = deployments.local_deployment_for(route)
    return local_queue(local.name, priority) if local else priority


class PlacingDispatcher:
    """A Dispatcher that sends local deployments' batches to their own queues."""

    def __init__(self, inner: Dispatcher, sessions: sessionmaker[Session],
                 deployments: Deployments) -> None:
        self._inner = inner
        self._sessions = sessions
        self._deployments = deployments

    def dispatch(self, queue: str, batches: list[BatchRef]) -> None:
        if not self._deployments.has_local or not batches:
            self._inner.dispatch(queue, batches)
            return
        by_queue: dict[str, list[BatchRef]] = {}
        for job_id in dict.fromkeys(ref.job_id for ref in batches):
            refs = [ref for ref in batches if ref.job_id == job_id]
            for target, ref in self._split(job_id, refs, queue):
                by_queue.setdefault(target, []).append(ref)
        for target, refs in by_queue.items():
            self._inner.dispatch(target, refs)

    def _split(self, job_id: str, refs: list[BatchRef],
               priority: str) -> Iterator[tuple[str, BatchRef]]:
        """Each batch as runs of consecutive lines bound for one queue."""
        placed = self._placements(job_id, min(r.first_line for r in refs),
                                  max(r.last_line for r in refs), priority)
        for ref in refs:
            run_start, run_queue = ref.first_line, None
            previous = ref.first_line
            for line in range(ref.first_line, ref.last_line + 1):
                target = placed.get(line)
                if target is None:  # an invalid line: it rides with its neighbours
                    continue
                if run_queue is not None and target != run_queue:
                    yield run_queue, BatchRef(job_id, run_start, previous)
                    run_start = line
                run_queue, previous = target, line
            yield run_queue or priority, BatchRef(job_id, run_start, ref.last_line)

    def _placements(self, job_id: str, first: int, last: int,
                    priority: str) -> dict[int, str]:
        """The queue of every request line in the range, from the route ingest stored with
        it (an item stored before routes were, migration 0008, by its body's model: the
        body is read only for those)."""
        with self._sessions() as session:
            rows = session.execute(
                select(Item.line_no, Item.route, case((Item.route.is_(None), Item.body)))
                .where(Item.job_id == job_id, Item.line_no.between(first, last),
                       Item.body.is_not(None))).all()
        names = {route: queue_for(self._deployments, route, priority)
                 for route in {route for _, route, _ in rows if route is not None}}
        return {line: names[route] if route is not None else queue_for(
                    self._deployments, self._deployments.route_name_for(body.get("model")),
                    priority)
                for line, route, body in rows}
