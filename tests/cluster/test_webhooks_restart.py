"""Webhooks survive the worker: the outbox is in PostgreSQL, so a worker killed (SIGKILL)
after a job ended but before its event was delivered leaves the delivery to the next
worker, whether the job's end had not been swept yet or an attempt was under way."""

import io
import os
import signal
import time
from pathlib import Path

import pytest
from sqlalchemy import select, text
from sqlalchemy.orm import Session, sessionmaker
from standardwebhooks import Webhook

from quotaflow.config import Settings
from quotaflow.db import get_engine
from quotaflow.ingest import pipeline
from quotaflow.models import Job
from quotaflow.webhooks import endpoints
from quotaflow.webhooks.webhook_tables import WebhookDelivery
from tests.harness.cluster import deployment_file, job_status, start_provider, start_workers
from tests.harness.factories import chat_line, jsonl
from tests.harness.procs import Proc
from tests.harness.servers import REDIS_URL, service_env
from tests.harness.webhook_receiver import Receiver
from workers.dispatch import CeleryDispatcher

KEY = "test-webhook-master-key-0123456789abcdef"

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def webhook_tables(pg_url: str, pg_sessions: sessionmaker[Session]) -> sessionmaker[Session]:
    with get_engine(pg_url).begin() as conn:
        conn.execute(text("TRUNCATE webhook_endpoints CASCADE"))
    return pg_sessions


def kill(worker: Proc) -> None:
    """SIGKILL the worker and its pool: no shutdown handler runs."""
    os.killpg(worker.pid, signal.SIGKILL)
    worker.popen.wait(10)
    worker.stop()


@pytest.mark.parametrize("when", ["before the sweep", "during an attempt"])
def test_a_worker_killed_before_delivery_still_leads_to_one_delivery(
        pg_url: str, webhook_tables: sessionmaker[Session], redis_url: str, tmp_path: Path,
        when: str) -> None:
    sessions = webhook_tables
    # The first attempt hangs: the worker is killed while it waits for the answer.
    receiver = Receiver(answers=("hang",) if when == "during an attempt" else ())
    procs: list[Proc] = []
    try:
        provider, provider_url = start_provider(tmp_path)
        procs.append(provider)
        deployments = deployment_file(tmp_path, "hooks", provider_url)
        settings = Settings(database_url=pg_url, broker_url=REDIS_URL,
                            deployments_file=deployments, webhook_secret_key=KEY,
                            webhook_allowed_networks="127.0.0.0/8", _env_file=None)
        endpoint, secret = endpoints.create_endpoint(sessions, settings, "default",
                                                     receiver.url, None)
        env = service_env(QUOTAFLOW_DATABASE_URL=pg_url, QUOTAFLOW_BROKER_URL=REDIS_URL,
                          QUOTAFLOW_DEPLOYMENTS_FILE=str(deployments),
                          QUOTAFLOW_WEBHOOK_SECRET_KEY=KEY,
                          QUOTAFLOW_WEBHOOK_ALLOWED_NETWORKS="127.0.0.0/8",
                          QUOTAFLOW_WEBHOOK_POLL_INTERVAL_S="0.2",
                          # the claim of the killed worker lapses 2 x 3 + 5 s after it
                          QUOTAFLOW_WEBHOOK_TIMEOUT_S="3")
        first_env = env | ({"QUOTAFLOW_WEBHOOK_DELIVERY": "false"}
                           if when == "before the sweep" else {})
        [first] = start_workers(first_env, tmp_path, "hooks-first", count=1)
        procs.append(first)
        # Given a job that ended while the first worker ran
        job = pipeline.create_job_in_process(
            sessions, io.BytesIO(jsonl([chat_line("a"), chat_line("b")])), settings=settings,
            deployments=settings.load_deployments(), dispatcher=CeleryDispatcher(REDIS_URL),
            queue="realtime")
        deadline = time.monotonic() + 60
        while job_status(sessions, job.id) == "in_progress":
            assert time.monotonic() < deadline, first.log()
            time.sleep(0.2)
        if when == "before the sweep":
            time.sleep(1.0)
            with sessions() as session:  # its delivery is off: nothing was swept or sent
                assert session.scalar(select(Job.notified_at).where(Job.id == job.id)) is None
            assert receiver.requests == []
        else:
            receiver.wait_for(1)  # the first attempt is out, and waits for its answer
        # When that worker is killed, and another one starts
        kill(first)
        procs.remove(first)
        procs += start_workers(env, tmp_path, "hooks-second", count=1)
        # Then the endpoint accepts the event once
        expected = 1 if when == "before the sweep" else 2
        requests = receiver.wait_for(expected, timeout=40)
        time.sleep(1.5)
        assert len(receiver.requests) == expected
        headers, body = requests[-1]
        event = Webhook(secret).verify(body, headers)
        assert (event["type"], event["data"]["id"]) == ("batch.completed", job.id)
        if when == "during an attempt":  # the message sent again is the same message
            assert requests[0][0]["webhook-id"] == headers["webhook-id"]
            assert requests[0][1] == body
        with sessions() as session:
            [delivery] = session.scalars(select(WebhookDelivery)).all()
            [listed] = endpoints.list_deliveries(session, "default", endpoint.id)
        assert (delivery.endpoint_id, delivery.status) == (endpoint.id, "delivered")
        assert [a["status_code"] for a in listed["attempts"]] == [200]
    finally:
        receiver.close()
        for proc in reversed(procs):
            proc.stop()
