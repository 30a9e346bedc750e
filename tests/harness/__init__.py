"""The test harness: what starts, drives and measures quotaflow for the tests and bench/.

This package is the public side of tests/: the tests in tests/unit/ and tests/cluster/
import from it, and so do the benchmarks in bench/; nothing here imports a test module
or tests/conftest.py (the fixtures there are built on these modules). Each module is
one concept; import the module you need (`from tests.harness.procs import Proc`): this
file imports none of them, so a unit test that needs factories pulls in no cluster.

Servers and processes
    servers          the test database and Redis URLs (one each per xdist worker),
                     `recreate_database`, `service_env` for child processes, ROOT
    procs            `Proc`: a real process started and stopped by its pid;
                     `free_port`, `quotaflow(...)` (the CLI's argv)
    cluster          a mock provider, a deployments file naming it, Celery workers, and
                     a job's progress read from the database
    tallies          `mismatches`: where the kept job tallies differ from a recount
    api_app          the API in this process (FastAPI's TestClient) on given settings
    webhook_receiver an HTTP endpoint that records webhook deliveries
    promtool         Prometheus's checker on deploy/monitoring/
    redis_cluster    a real Redis Cluster on loopback (masters, replicas, a master
                     killed by pid, its failover awaited)
    s3_server        moto's S3 server on loopback, a bucket made: object storage paths
    browser          Debian's headless Chromium driven over the DevTools protocol
                     (navigate, evaluate, click, screenshot): the console's test

Clusters for one question each (a test asserts on them, a bench prints their table)
    limiter_cluster, anthropic_cluster, openai_cluster, pbatch_cluster, fair_cluster,
    realtime_flood, long_ratio, chaos_cluster (faults and the reliability table),
    api_load (a large job and the API under a crowd) with api_clients (pollers and
    submitters, each one keep-alive connection, bounded by deadline and cap),
    multihost_cluster with netns and netproxy (hosts as network namespaces) and
    multihost_jobs (jobs on it and the across-hosts table)

Data and models
    factories        input-file builders (`chat_line`, `jsonl`, ...)
    conformance      the conformance set (real-world lines and what each deployment
                     family must be sent) and `field_diff` to compare bodies
    openai_answers   what an OpenAI-compatible server's answer to a line must look like
    tiny_model       tiny random-weight models saved like real checkpoints
    vllm_server      a real vLLM server on such a model
"""
