"""An item's claim and its lease renewals are HOT updates on PostgreSQL: no index entry
is written for them (migration 0017). Each request updates its item twice; with status
or lease_expires_at in an index, both rewrote every index of the items table, which was
most of PostgreSQL's CPU per request (issue 29)."""

import io
from collections.abc import Iterator
from datetime import timedelta

import orjson
from sqlalchemy import Connection, text
from sqlalchemy.orm import sessionmaker

from quotaflow.config import Settings
from quotaflow.db import get_engine
from quotaflow.dispatch.queues import BatchRef
from quotaflow.ingest import pipeline
from quotaflow.jobs import service as jobs
from quotaflow.models import ItemStatus, Job, JobStatus, utcnow
from quotaflow.providers.base import ProviderResponse
from quotaflow.results.leases import claim, renew, store_many
from quotaflow.results.rows import result_row
from quotaflow.store import postgres
from tests.cluster.test_jobs import Collect
from tests.harness.factories import chat_line, jsonl

LINES = 40
LEASE = timedelta(seconds=60)


def _updates(conn: Connection) -> tuple[int, int]:
    """(updates, HOT updates) of the items table by this backend, not yet flushed to the
    cumulative statistics (this transaction's, and maybe some before it: use the
    difference)."""
    upd, hot = conn.execute(text(
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables "
        "WHERE relname = 'items'")).one()
    return upd, hot


def _more(conn: Connection, before: tuple[int, int]) -> tuple[int, int]:
    after = _updates(conn)
    return after[0] - before[0], after[1] - before[1]


def test_claims_and_renewals_rewrite_no_index_and_closing_ends_the_job(pg_sessions,
                                                                        pg_url: str) -> None:
    # Given a job of 40 lines, stored by ingest's COPY
    settings = Settings(database_url=pg_url, _env_file=None)
    job = pipeline.create_job_in_process(
        pg_sessions, io.BytesIO(jsonl([chat_line(f"h{i}") for i in range(LINES)])),
        settings=settings, deployments=settings.load_deployments(), dispatcher=Collect(),
        queue="bulk", filename="in.jsonl")
    engine = get_engine(pg_url)
    # (the functions' transactions are savepoints of the test's, whose statistics
    # pg_stat_xact_user_tables reads)
    with engine.connect() as conn, conn.begin():
        sessions = sessionmaker(bind=conn, join_transaction_mode="create_savepoint")
        # When a worker claims them all
        before = _updates(conn)
        items = claim(sessions, BatchRef(job.id, 1, LINES), "me", LEASE)
        assert len(items) == LINES
        assert _more(conn, before) == (LINES, LINES)  # every claim HOT
    with engine.connect() as conn, conn.begin():
        sessions = sessionmaker(bind=conn, join_transaction_mode="create_savepoint")
        # and, later, renews their leases
        before = _updates(conn)
        assert renew(sessions, job.id, "me", LEASE, (1, LINES)) == LINES
        assert _more(conn, before) == (LINES, LINES)  # every renewal HOT
    with engine.connect() as conn, conn.begin():
        sessions = sessionmaker(bind=conn, join_transaction_mode="create_savepoint")
        assert renew(sessions, job.id, "me", LEASE) == LINES  # the range unknown: the same
        # and stores their answers
        answer = ProviderResponse(200, {"choices": []}, "req_1", 1, 1)
        assert store_many(sessions, job.id, [(item, answer) for item in items],
                          share=False) == (LINES, 0)
        jobs.finish_if_done(sessions, job.id)
    # Then closing them ended the job (is_open, the index of open items, changed)
    with pg_sessions() as session:
        assert session.get(Job, job.id).status == JobStatus.COMPLETED


def test_a_chunk_write_reads_its_own_rows_not_the_jobs(pg_sessions, pg_url: str) -> None:
    # Given a job of 6,400 open lines, its statistics known (a size at which joining the
    # chunk to the items alone was planned as a scan of all the job's open items)
    settings = Settings(database_url=pg_url, _env_file=None)
    lines = 6400
    job = pipeline.create_job_in_process(
        pg_sessions, io.BytesIO(jsonl([chat_line(f"c{i}") for i in range(lines)])),
        settings=settings, deployments=settings.load_deployments(), dispatcher=Collect(),
        queue="bulk", filename="in.jsonl")
    items = claim(pg_sessions, BatchRef(job.id, 1, 64), "me", LEASE)
    rows = [result_row(item.line_no, item.custom_id,
                       ProviderResponse(200, {"choices": []}, "r", 1, 1), None)
            for item in items]
    document = orjson.dumps([postgres._json_columns(row) for row in rows]).decode()
    # When a chunk of 64 is written (its plan read)
    with get_engine(pg_url).connect() as conn, conn.begin():
        conn.exec_driver_sql("ANALYZE items")
        raw = conn.connection.driver_connection
        with raw.cursor() as cursor:
            cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + postgres._STORE_CHUNK,
                           (job.id, utcnow(), document, ItemStatus.SUCCEEDED,
                            ItemStatus.FAILED, job.id, [item.line_no for item in items],
                            list(ItemStatus.OPEN)))
            [[plan]] = cursor.fetchall()
        conn.rollback()
    # Then the items it read are its own 64, not the job's 6,400
    scans = list(_scans(plan[0]["Plan"], "items"))
    assert scans, plan
    assert sum((scan["Actual Rows"] + scan.get("Rows Removed by Filter", 0))
               * scan["Actual Loops"] for scan in scans) == 64, scans


def _scans(node: dict, table: str) -> Iterator[dict]:
    if node.get("Relation Name") == table and "Scan" in node["Node Type"]:
        yield node
    for child in node.get("Plans", []):
        yield from _scans(child, table)
