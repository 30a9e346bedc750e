"""The outbox on the real PostgreSQL, several delivery loops at once: each ended job gives
one event per matching endpoint, and each delivery is sent once, however many workers
sweep and claim together (SKIP LOCKED)."""

import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.config import Settings
from quotaflow.db import get_engine
from quotaflow.models import Job, utcnow
from quotaflow.webhooks import endpoints
from quotaflow.webhooks.delivery_round import DeliveryLoop
from quotaflow.webhooks.webhook_tables import WebhookDelivery
from tests.harness.webhook_receiver import Receiver

KEY = "test-webhook-master-key-0123456789abcdef"
JOBS = 30

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def sessions(pg_url: str, pg_sessions: sessionmaker[Session]) -> sessionmaker[Session]:
    with get_engine(pg_url).begin() as conn:
        conn.execute(text("TRUNCATE webhook_endpoints CASCADE"))
    return pg_sessions


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    made = Receiver()
    yield made
    made.close()


def ended_job(status: str, tenant: str = "t1") -> Job:
    return Job(id=f"batch_{uuid.uuid4().hex}", status=status, queue="standard",
               endpoint="/v1/chat/completions", tenant=tenant, total=0, created_at=utcnow(),
               **{f"{status}_at": utcnow()})


def test_three_loops_send_each_event_once(sessions: sessionmaker[Session], pg_url: str,
                                          receiver: Receiver) -> None:
    settings = Settings(database_url=pg_url, webhook_secret_key=KEY,
                        webhook_allowed_networks="127.0.0.0/8",
                        webhook_retry_schedule_s="0,0.2", _env_file=None)
    endpoints.create_endpoint(sessions, settings, "t1", receiver.url,
                              ["batch.completed", "batch.cancelled"])
    endpoints.create_endpoint(sessions, settings, "t2", receiver.url, None)
    with sessions.begin() as session:
        session.add_all([ended_job("completed") for _ in range(JOBS)])
        session.add_all([ended_job("failed"),  # t1 did not ask for failures
                         ended_job("cancelled"), ended_job("expired", tenant="t2"),
                         ended_job("completed", tenant="nobody")])
    loops = [DeliveryLoop(sessions, settings) for _ in range(3)]
    deadline = time.monotonic() + 30

    def run(loop: DeliveryLoop) -> None:
        while len(receiver.requests) < JOBS + 2 and time.monotonic() < deadline:
            loop.round()
            time.sleep(0.05)

    threads = [threading.Thread(target=run, args=(loop,)) for loop in loops]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    time.sleep(0.5)
    for loop in loops:
        loop.round()  # nothing is left to send
        loop.close()
    ids = [headers["webhook-id"] for headers, _ in receiver.requests]
    assert len(ids) == JOBS + 2 and len(set(ids)) == JOBS + 2
    with sessions() as session:
        assert session.scalar(select(func.count()).select_from(Job)
                              .where(Job.notified_at.is_(None))) == 0
        by_type = dict(session.execute(select(WebhookDelivery.event_type, func.count())
                                       .group_by(WebhookDelivery.event_type)).all())
        statuses = set(session.scalars(select(WebhookDelivery.status)))
    assert by_type == {"batch.completed": JOBS, "batch.cancelled": 1, "batch.expired": 1}
    assert statuses == {"delivered"}
