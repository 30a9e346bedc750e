"""Commands that start quotaflow's long-running parts: API, workers, Flower, mock provider.

The API and the workers are started by module path (uvicorn / celery), never by
import, so the CLI stays independent of api/ and workers/. The mock provider is
a package of its own with a typed settings object: the command builds that
object from its options and hands uvicorn the app, imported only when the
command runs.
"""

import logging
import os
import socket
import sys
import tempfile
from typing import Any

import click

from cli import api_processes, worker_group
from cli.worker_group import companion_node
from quotaflow.config import get_settings
from quotaflow.constants import QUEUE_REALTIME, QUEUES, local_queue
from quotaflow.errors import ConfigError
from quotaflow.observe import logs

API_GRACEFUL_S = 5  # every API process ends within seconds of SIGTERM or SIGINT


def _celery_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "celery", "-A", "workers.app:app", *args]


def _exec_celery(*args: str, env: dict[str, str] | None = None) -> None:
    argv = _celery_argv(*args)
    os.execvpe(argv[0], argv, {**os.environ, **(env or {})})


def _start_worker(main: list[str], env: dict[str, str], slots: int | None, shared: bool,
                  queues: list[str], node: str, quiet: list[str], loglevel: str) -> None:
    """Exec the Celery worker, or supervise it beside a realtime companion when it takes
    realtime and other queues and slots are kept. Only a `shared` worker keeps any: a
    --deployment worker looks at its queues in priority order instead (workers/app.py)."""
    if slots is None:
        slots = get_settings().worker_realtime_slots
    if shared and slots and QUEUE_REALTIME in queues and len(queues) > 1:
        _run_with_realtime_slots(main, env, slots, node, quiet, loglevel)
    else:
        _exec_celery(*main, env=env)


def _run_with_realtime_slots(main: list[str], env: dict[str, str], slots: int, node: str,
                             quiet: list[str], loglevel: str) -> None:
    """The main worker and its realtime companion, supervised (cli/worker_group.py)."""
    companion_env = {"QUOTAFLOW_WEBHOOK_DELIVERY": "false",
                     "QUOTAFLOW_PROVIDER_BATCH_LOOP": "false"}
    if "PROMETHEUS_MULTIPROC_DIR" in env:  # its counters, served by the main worker
        companion_env["PROMETHEUS_MULTIPROC_DIR"] = env["PROMETHEUS_MULTIPROC_DIR"]
    companion = _celery_argv(*quiet, "worker", "-Q", QUEUE_REALTIME, "--concurrency",
                             str(slots), "--pool", "threads", "-n", companion_node(node),
                             "-l", loglevel, "-E")
    worker_group.exec_or_group([
        worker_group.Child(_celery_argv(*main), env),
        worker_group.Child(companion, companion_env, drop=("QUOTAFLOW_WORKER_METRICS_PORT",)),
    ])


def _check_local(name: str) -> None:
    """`--deployment` must name a local deployment of the deployments file."""
    from quotaflow.runtime import Runtime  # the domain's wiring: only the commands that serve

    known = Runtime(get_settings()).deployments.deployments
    if name not in known:
        raise ConfigError(f"--deployment {name!r}: no such deployment in the deployments file "
                          f"(QUOTAFLOW_DEPLOYMENTS_FILE); it has {', '.join(known)}")
    if known[name].provider != "local":
        raise ConfigError(f"--deployment {name!r} is a {known[name].provider!r} deployment; "
                          "only local deployments have workers of their own")


def _autoscale(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """`--autoscale MAX,MIN` as Celery takes it: whole numbers, MAX >= 1, MAX >= MIN >= 0."""
    if value is None:
        return None
    high, comma, low = value.partition(",")
    if not (comma and high.strip().isdigit() and low.strip().isdigit()):
        raise click.BadParameter(f"{value!r}: use MAX,MIN, two whole numbers (e.g. 8,2)",
                                 ctx, param)
    most, least = int(high), int(low)
    if most < 1 or least > most:
        raise click.BadParameter(f"{value!r}: MAX must be at least 1 and at least MIN "
                                 "(e.g. 8,2: up to 8 processes, 2 when idle)", ctx, param)
    return f"{most},{least}"


def flower_env(basic_auth: str | None, no_auth: bool) -> dict[str, str]:
    """Flower's environment; refuses to serve it open unless told to. Flower without basic
    auth closes its API but not its pages, which show every task's arguments and let
    anyone shut workers down or revoke tasks."""
    if not basic_auth:
        if not no_auth:
            raise ConfigError("Flower would serve its pages to anyone: set "
                              "QUOTAFLOW_FLOWER_BASIC_AUTH=user:password, or pass --no-auth "
                              "to serve it without a password")
        click.echo("warning: Flower runs without a password (--no-auth); anyone who reaches "
                   "its port can read task arguments and stop workers", err=True)
        return {}
    if not all(user and password for user, _, password in
               (pair.partition(":") for pair in basic_auth.split(","))):
        raise ConfigError("QUOTAFLOW_FLOWER_BASIC_AUTH must be user:password (several: "
                          "user1:password1,user2:password2)")
    # Passed through the environment so the password never shows in `ps`.
    return {"FLOWER_BASIC_AUTH": basic_auth}


def metrics_env(port: int | None) -> dict[str, str]:
    """The worker's environment for a metrics server on `port`: a fresh directory of its
    own for prometheus_client's multiprocess files, set before Celery starts so that every
    pool process it forks writes there (prometheus_client reads the variable at import).
    Never a directory shared with another worker: each serves the sum of all files in
    its directory. The worker removes it when it shuts down (workers/metrics.py)."""
    if port is None:
        return {}
    directory = tempfile.mkdtemp(prefix="quotaflow-metrics-")
    return {"QUOTAFLOW_WORKER_METRICS_PORT": str(port), "PROMETHEUS_MULTIPROC_DIR": directory}


@click.command()
@click.option("--host", default=None, help="Default: QUOTAFLOW_API_HOST (127.0.0.1).")
@click.option("--port", default=None, type=int, help="Default: QUOTAFLOW_API_PORT (8000).")
@click.option("--workers", default=None, type=click.IntRange(1, 64),
              help="Processes serving the API, each listening on the one port (a "
                   "supervisor restarts any that dies). Default: QUOTAFLOW_API_WORKERS (1).")
def api(host: str | None, port: int | None, workers: int | None) -> None:
    """Serve the REST API (OpenAPI docs at /docs)."""
    from quotaflow import preflight  # the checks pull in the whole domain

    settings = get_settings()
    preflight.ensure_ready(settings, "quotaflow api")
    logs.configure(settings, logging.INFO)
    # log_config=None: uvicorn's records reach the root logger, in quotaflow's format
    # (api/process.py sets it up in each worker process). A stop waits at most
    # API_GRACEFUL_S for requests in flight (a long-poll, a download), then closes them.
    options: dict[str, Any] = {"app": "api.process:app", "log_level": "info",
                               "log_config": None,
                               "timeout_graceful_shutdown": API_GRACEFUL_S}
    sys.exit(api_processes.serve(options, host or settings.api_host,
                                 port or settings.api_port,
                                 workers or settings.api_workers, API_GRACEFUL_S))

@click.command()
@click.option("--queues", default=",".join(QUEUES), show_default=True,
              help="Comma-separated queues (priority classes) this worker consumes.")
@click.option("--concurrency", default=2, show_default=True, type=click.IntRange(1, 512))
@click.option("--name", default=None, help="Worker node name (default: quotaflow-PID@host).")
@click.option("--loglevel", default="info", show_default=True)
@click.option("--deployment", default=None, metavar="NAME",
              help="Serve the local deployment NAME: load its model once, run batches "
                   "in threads that share it, consume only its queues "
                   "(local.NAME.PRIORITY). Pin to a GPU with CUDA_VISIBLE_DEVICES.")
@click.option("--autoscale", default=None, metavar="MAX,MIN", callback=_autoscale,
              help="Let Celery grow the pool up to MAX processes while batches wait and "
                   "shrink it to MIN when idle (overrides --concurrency).")
@click.option("--metrics-port", default=None, type=click.IntRange(1, 65535),
              help="Serve this worker's Prometheus metrics (all its pool processes) at "
                   "http://HOST:PORT/metrics. Default: QUOTAFLOW_WORKER_METRICS_PORT; "
                   "unset: no metrics server.")
@click.option("--realtime-slots", default=None, type=click.IntRange(0, 64),
              help="When this worker consumes realtime beside other queues: threads kept "
                   "for realtime batches alone, so a realtime job never waits behind a "
                   "bulk flood for a pool slot (a second Celery worker, named NAME with "
                   "-realtime). 0: none, every slot takes any queue. Default: "
                   "QUOTAFLOW_WORKER_REALTIME_SLOTS (1).")
def worker(queues: str, concurrency: int, name: str | None, loglevel: str,
           deployment: str | None, autoscale: str | None, metrics_port: int | None,
           realtime_slots: int | None) -> None:
    """Start a Celery worker for the given queues (with a slot kept for realtime when it
    consumes realtime and other queues: docs/concepts/queues.md)."""
    chosen = [q.strip() for q in queues.split(",") if q.strip()]
    unknown = [q for q in chosen if q not in QUEUES]
    if unknown or not chosen:
        raise ConfigError(f"unknown queue(s) {unknown}; choose from {', '.join(QUEUES)}")
    node = name or f"quotaflow-{os.getpid()}@{socket.gethostname()}"
    # Celery's autoscaler grows and shrinks the process pool; the threads pool cannot.
    pool = [f"--autoscale={autoscale}"] if autoscale else []
    env: dict[str, str] = {}
    if deployment is not None:
        if autoscale:
            raise click.UsageError("--autoscale needs the process pool; a --deployment "
                                   "worker runs threads sharing one model")
        _check_local(deployment)
        chosen = [local_queue(deployment, q) for q in chosen]
        # Threads, not processes: one model per worker process (per GPU), shared by
        # every batch it runs, so their requests meet in one dynamic batcher.
        pool = ["--pool", "threads"]
        env["QUOTAFLOW_WORKER_DEPLOYMENT"] = deployment
    env |= metrics_env(metrics_port or get_settings().worker_metrics_port)
    # JSON logs: no banner, so that every line of the worker's output parses.
    quiet = ["--quiet"] if get_settings().log_format == "json" else []
    # The options are checked first (above), then what the worker depends on.
    from quotaflow import preflight  # the checks pull in the whole domain

    preflight.ensure_ready(get_settings(), "quotaflow worker", only=deployment)
    main = [*quiet, "worker", "-Q", ",".join(chosen), "--concurrency", str(concurrency),
            *pool, "-n", node, "-l", loglevel, "-E"]
    _start_worker(main, env, realtime_slots, deployment is None, chosen, node, quiet,
                  loglevel)

@click.command()
@click.option("--port", default=None, type=int, help="Default: QUOTAFLOW_FLOWER_PORT (5555).")
@click.option("--address", default="127.0.0.1", show_default=True)
@click.option("--no-auth", is_flag=True,
              help="Serve Flower's pages without a password (development only; its API "
                   "stays closed). Without this flag Flower needs "
                   "QUOTAFLOW_FLOWER_BASIC_AUTH.")
def flower(port: int | None, address: str, no_auth: bool) -> None:
    """Start Flower to watch the workers (basic auth from QUOTAFLOW_FLOWER_BASIC_AUTH)."""
    # Flower's own variable counts too, for a set-up that already sets it.
    basic_auth = get_settings().flower_basic_auth or os.environ.get("FLOWER_BASIC_AUTH")
    env = flower_env(basic_auth, no_auth)
    _exec_celery("flower", f"--port={port or get_settings().flower_port}",
                 f"--address={address}", env=env)

@click.group()
def db() -> None:
    """Database schema commands."""

@db.command("upgrade")
def db_upgrade() -> None:
    """Apply every Alembic migration to QUOTAFLOW_DATABASE_URL."""
    from quotaflow.db import upgrade

    upgrade(get_settings().database_url)
    click.echo("database is at the newest migration")

@click.command("mock-provider")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=9000, show_default=True, type=int)
@click.option("--rpm", default=600, show_default=True, type=click.IntRange(1))
@click.option("--tpm", default=200_000, show_default=True, type=click.IntRange(1))
@click.option("--itpm", type=click.IntRange(1),
              help="Input tokens per minute of /v1/messages (Anthropic's ITPM; default: "
                   "--tpm).")
@click.option("--otpm", type=click.IntRange(1),
              help="Output tokens per minute of /v1/messages (Anthropic's OTPM; default: "
                   "--tpm).")
@click.option("--latency-ms", default=50.0, show_default=True, type=click.FloatRange(0))
@click.option("--burst-seconds", default=60.0, show_default=True,
              type=click.FloatRange(0, min_open=True),
              help="Window the limits are enforced over (OpenAI may use 1 s).")
@click.option("--default-max-tokens", default=256, show_default=True, type=click.IntRange(1))
@click.option("--api-key-env", default=None, help="Env var holding the key clients must send.")
@click.option("--reconcile/--no-reconcile", default=True, show_default=True,
              help="Bill real usage after each answer (refund unused max_tokens).")
@click.option("--fault", "faults", multiple=True, metavar="KIND=FRACTION",
              help="Inject failures: 429, 500, 529, reset, hang, malformed (e.g. --fault "
                   "500=0.05).")
@click.option("--record", default=None, metavar="PATH",
              help="Test-only: append every model request's body to this JSONL file.")
@click.option("--unlimited", is_flag=True,
              help="Admit everything, as cheaply as possible (a raw ASGI app, no buckets, "
                   "no x-ratelimit headers): for throughput benchmarks. --rpm, --tpm, "
                   "--burst-seconds and --reconcile do not apply.")
def mock_provider(host: str, port: int, rpm: int, tpm: int, itpm: int | None,
                  otpm: int | None, latency_ms: float,
                  burst_seconds: float, default_max_tokens: int,
                  api_key_env: str | None, reconcile: bool, faults: tuple[str, ...],
                  record: str | None, unlimited: bool) -> None:
    """Serve a simulated OpenAI-compatible API that enforces RPM/TPM strictly (429s), or,
    with --unlimited, one that admits everything at the least CPU per request."""
    given: dict[str, Any] = {"unlimited": unlimited, "latency_ms": latency_ms}
    if api_key_env:
        given["api_key_env"] = api_key_env
    if unlimited:
        if faults:
            raise ConfigError("--fault needs the strict provider; leave out --unlimited")
    else:
        given |= {"rpm": rpm, "tpm": tpm, "itpm": itpm, "otpm": otpm,
                  "burst_seconds": burst_seconds,
                  "default_max_tokens": default_max_tokens, "reconcile": reconcile,
                  "record": record, **_fault_fractions(faults)}
    _serve_mock(host, port, given)


def register(cli: click.Group) -> None:
    """Add this module's commands to the `quotaflow` group."""
    for command in (api, worker, flower, db, mock_provider):
        cli.add_command(command)

def _fault_fractions(faults: tuple[str, ...]) -> dict[str, float]:
    """`--fault KIND=FRACTION` options as MockProviderSettings fields (fault_KIND)."""
    fractions: dict[str, float] = {}
    for fault in faults:
        kind, _, fraction = fault.partition("=")
        try:
            value = float(fraction)
        except ValueError:
            value = None
        if kind not in ("429", "500", "529", "reset", "hang", "malformed") or value is None:
            raise ConfigError(f"--fault {fault!r}: use KIND=FRACTION with KIND one of "
                              "429, 500, 529, reset, hang, malformed and FRACTION a number")
        fractions[f"fault_{kind}"] = value
    return fractions


def _serve_mock(host: str, port: int, given: dict[str, Any]) -> None:
    """Serve the mock provider from `given`; what the options leave out (the faults and
    the key's variable, when not given) comes from QUOTAFLOW_MOCK_* as before."""
    import uvicorn

    from mock_provider import MockProviderSettings, build_app

    settings = MockProviderSettings.load(**given)
    app = build_app(settings)
    if settings.unlimited:
        # No access log: formatting a line per request would cost more than the answer.
        uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
    else:
        uvicorn.run(app, host=host, port=port, log_level="warning")
