"""anthropic-beta on the wire: a line's params.betas reach the strict Messages API mock
as the header (the mock refuses `betas` as a body field with a 400), through the
executor in this process with PostgreSQL, the Redis limiter and a recording mock."""

import io
import json
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from quotaflow.budget.buckets import RedisLimiter
from quotaflow.config import Settings
from quotaflow.deployments.catalog import load_deployments
from quotaflow.dispatch.queues import CollectingDispatcher
from quotaflow.execution import BatchExecutor
from quotaflow.ingest import pipeline
from quotaflow.results.output import iter_output
from tests.harness.cluster import start_provider

PARAMS = {"model": "claude", "max_tokens": 20,
          "messages": [{"role": "user", "content": "hello"}]}


def test_a_lines_betas_go_out_as_the_anthropic_beta_header(
        pg_sessions: sessionmaker[Session], pg_url: str, redis_url: str, tmp_path: Path) -> None:
    record = tmp_path / "received.jsonl"
    provider, url = start_provider(tmp_path, "--rpm", "60000", "--tpm", "10000000",
                                   "--latency-ms", "1", "--record", str(record))
    try:
        deployments = tmp_path / "deployments.toml"
        deployments.write_text(
            f'[deployments.claude]\nprovider = "anthropic"\nbase_url = "{url}"\n'
            'model = "claude-beta"\nrpm = 60000\ntpm = 10000000\n[routes]\n"*" = "claude"\n')
        settings = Settings(database_url=pg_url, broker_url=redis_url,
                            deployments_file=deployments, _env_file=None)
        loaded = load_deployments(deployments)
        lines = [{"custom_id": "with", "params": {**PARAMS, "betas": ["b-1", "b-2"]}},
                 {"custom_id": "without", "params": {**PARAMS, "max_tokens": 21}}]
        dispatcher = CollectingDispatcher()
        job = pipeline.create_job_in_process(
            pg_sessions, io.BytesIO("".join(json.dumps(x) + "\n" for x in lines).encode()),
            settings=settings, deployments=loaded, dispatcher=dispatcher, queue="realtime")
        executor = BatchExecutor(pg_sessions, loaded, RedisLimiter(redis_url), settings,
                                 defer=False)
        for ref in dispatcher.batches:
            executor.run(ref)
        with pg_sessions() as session:
            out = [json.loads(x) for x in iter_output(session, job.id, errors=False)]
    finally:
        provider.stop()
    assert [o["result"]["type"] for o in out] == ["succeeded", "succeeded"], out
    received = {r["body"]["max_tokens"]: r
                for r in map(json.loads, record.read_text().splitlines())}
    assert received[20]["headers"]["anthropic-beta"] == "b-1,b-2"
    assert "betas" not in received[20]["body"]
    assert "anthropic-beta" not in received[21]["headers"]
