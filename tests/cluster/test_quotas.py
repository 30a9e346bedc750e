"""The enqueued-token quota on the real Postgres: what counts, whose limit applies, and
that the per-tenant lock keeps two batches committing at once from both slipping under it."""

import threading
import time

import pytest
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.config import Settings
from quotaflow.errors import EnqueuedTokenLimit
from quotaflow.models import Job, JobStatus, utcnow
from quotaflow.tenants import keys as auth
from quotaflow.tenants import quotas


def add_job(sessions: sessionmaker[Session], tenant: str, tokens: int, status: str) -> None:
    with sessions.begin() as session:
        session.add(Job(id=f"batch_{tenant}_{status}_{tokens}", status=status, queue="bulk",
                        endpoint="/v1/chat/completions", total=1, created_at=utcnow(),
                        tenant=tenant, enqueued_tokens=tokens))


def test_only_unfinished_batches_of_the_tenant_count(pg_sessions: sessionmaker[Session],
                                                     settings: Settings) -> None:
    add_job(pg_sessions, "qa", 600, JobStatus.IN_PROGRESS)
    add_job(pg_sessions, "qa", 100, JobStatus.CANCELLING)
    add_job(pg_sessions, "qa", 5000, JobStatus.COMPLETED)
    add_job(pg_sessions, "qb", 5000, JobStatus.IN_PROGRESS)
    limited = settings.model_copy(update={"max_enqueued_tokens": 1000})
    with pg_sessions() as session:
        assert quotas.enqueued_tokens(session, "qa") == 700
        quotas.check(session, limited, "qa", 300)  # exactly at the limit fits
        with pytest.raises(EnqueuedTokenLimit, match=r"about 301 .* hold 700, .* limit is 1,000"):
            quotas.check(session, limited, "qa", 301)
        quotas.check(session, settings, "qa", 10**9)  # no limit set: anything goes


def test_a_tenants_own_limit_overrides_the_setting(pg_sessions: sessionmaker[Session],
                                                   settings: Settings) -> None:
    auth.create_key(pg_sessions, "qc", max_enqueued_tokens=50)
    with pg_sessions() as session:
        assert quotas.token_limit(session, settings, "qc") == 50
        with pytest.raises(EnqueuedTokenLimit):
            quotas.check(session, settings.model_copy(update={"max_enqueued_tokens": 10**6}),
                         "qc", 51)


def test_admit_holds_the_tenant_until_its_batch_commits(pg_sessions: sessionmaker[Session],
                                                         settings: Settings) -> None:
    limited = settings.model_copy(update={"max_enqueued_tokens": 1000})
    entered: list[float] = []

    def second() -> None:
        try:
            with pg_sessions.begin() as session:
                quotas.admit(session, limited, "qd", 600)
                entered.append(time.monotonic())
        except EnqueuedTokenLimit:
            entered.append(-1.0)

    with pg_sessions.begin() as session:
        quotas.admit(session, limited, "qd", 600)
        thread = threading.Thread(target=second)
        thread.start()
        time.sleep(0.5)
        assert entered == []  # the second waits while the first is being created
        session.add(Job(id="batch_qd_first", status=JobStatus.IN_PROGRESS, queue="bulk",
                        endpoint="/v1/chat/completions", total=1, created_at=utcnow(),
                        tenant="qd", enqueued_tokens=600))
    thread.join(10)
    assert entered == [-1.0]  # and then sees the first's tokens: refused
