"""quotaflow on vLLM's engine against vLLM's own batch runner, the transformers engine and
one request at a time; realtime latency under a bulk flood with and without priorities.

Runs under vLLM's interpreter (it imports vLLM; scripts/vllm-venv makes one):

    python -m bench.local_batching --engine vllm            # finds the venv itself
    $(bash scripts/vllm-venv) -m bench.local_vllm --requests 512

Every row runs the same N chat requests (bench/local_batching.py's prompts, greedy,
max_tokens M) on the same model: the tiny random-weight Llama of the vLLM tests (a
token a byte, head size 64), written with save_pretrained. Rows:

- one at a time: the vLLM engine in process, each request sent after the last answered;
- transformers: quotaflow's own engine, every request sent at once to its dynamic batcher;
- vLLM run_batch: `python -m vllm.entrypoints.openai.run_batch` on the same requests as
  an OpenAI batch file, timed from its "Reading batch" log line to "Writing outputs"
  (its model load left out, as the others' is);
- quotaflow + vLLM: the same file submitted as a job to a real `quotaflow worker
  --deployment` under this interpreter (PostgreSQL, Redis, Celery), timed from
  submission to `completed` in PostgreSQL, after a warm-up job of 8 requests (the
  in-process rows have their 8 warm-up requests too).

`--rounds N` alternates run_batch and the end-to-end job N times and reports the rounds
of median rate: on a shared or throttled VM one round moves by a fifth either way.

The warm-start table (bench/local_warm.py) loads a fresh engine twice, cold and warmed
up at load, and compares its first burst of requests with the next.

The priority table floods one in-process engine with bulk requests, sends realtime
ones in during the flood, and reports the realtime latencies, once with
scheduling_policy "priority" and once "fcfs". bench/local_stepped.py adds the
stepped-load comparison. PostgreSQL and Redis: QUOTAFLOW_BENCH_DATABASE_URL /
QUOTAFLOW_BENCH_REDIS_URL (quotaflow_bench and db 14 by default; the database is
dropped and made again).
"""

import argparse
import asyncio
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")

from bench.local_batching import messages
from bench.local_warm import warm_start
from quotaflow.constants import ENDPOINT_CHAT, QUEUE_BULK, QUEUE_REALTIME
from quotaflow.deployments.deployment import Deployment
from quotaflow.ingest import pipeline
from quotaflow.providers.local import LocalProvider
from quotaflow.providers.priority import current_queue
from tests.harness.tiny_model import save_tiny_model

ROOT = Path(__file__).resolve().parents[1]
PG_URL = os.environ.get("QUOTAFLOW_BENCH_DATABASE_URL",
                        "postgresql+psycopg://postgres@127.0.0.1:5432/quotaflow_bench")
REDIS_URL = os.environ.get("QUOTAFLOW_BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")


@dataclass
class Row:
    mode: str
    requests: int
    seconds: float
    completion_tokens: int

    @property
    def per_s(self) -> float:
        return self.requests / self.seconds


def write_model(directory: Path) -> Path:
    return save_tiny_model(directory, arch="llama", hidden=128, heads=2, layers=2,
                           context=2048, byte_level=True)


def deployment(model_dir: Path, args: argparse.Namespace, engine: str = "vllm",
               policy: str = "priority") -> Deployment:
    # The transformers engine on a CPU runs in float32 (its `auto`): bfloat16 matmuls are
    # several times slower there; vLLM's CPU kernels are made for bfloat16.
    dtype = args.dtype if engine == "vllm" or args.device != "cpu" else "float32"
    return Deployment(name=f"bench-{engine}", provider="local", model="tiny", engine=engine,
                      model_path=str(model_dir), device=args.device, dtype=dtype,
                      max_model_len=1024, max_num_seqs=args.max_num_seqs,
                      enforce_eager=args.device == "cpu", scheduling_policy=policy,
                      max_batch_size=args.batch_size, max_wait_ms=20, timeout_s=3600,
                      default_temperature=0, rpm=10_000_000, tpm=10_000_000_000,
                      max_concurrency=1024, engine_nice=args.engine_nice)


def body(i: int, max_tokens: int) -> dict:
    return {"messages": messages(i), "max_tokens": max_tokens, "temperature": 0}


def lines(count: int, max_tokens: int) -> list[dict]:
    return [{"custom_id": f"r{i}", "method": "POST", "url": ENDPOINT_CHAT,
             "body": {"model": "tiny", **body(i, max_tokens)}} for i in range(count)]


async def _timed(provider: LocalProvider, i: int, max_tokens: int, queue: str) -> tuple:
    current_queue.set(queue)
    started = time.perf_counter()
    answer = await provider.send(ENDPOINT_CHAT, body(i, max_tokens))
    return time.perf_counter() - started, answer.completion_tokens


def at_once(provider: LocalProvider, mode: str, count: int, max_tokens: int,
            first: int = 0) -> Row:
    """`count` requests sent at once (prompts numbered from `first`), timed to the last."""
    async def go() -> list:
        return await asyncio.gather(*(_timed(provider, i, max_tokens, QUEUE_BULK)
                                      for i in range(first, first + count)))
    started = time.perf_counter()
    answers = asyncio.run(go())
    return Row(mode, count, time.perf_counter() - started, sum(t for _, t in answers))


def one_at_a_time(provider: LocalProvider, count: int, max_tokens: int) -> Row:
    async def go() -> list:
        return [await _timed(provider, i, max_tokens, QUEUE_BULK) for i in range(count)]
    started = time.perf_counter()
    answers = asyncio.run(go())
    return Row("one at a time (vLLM engine)", count, time.perf_counter() - started,
               sum(t for _, t in answers))


def run_batch(model_dir: Path, args: argparse.Namespace, workdir: Path) -> Row:
    """vLLM's own batch runner on the same requests, as an OpenAI batch file."""
    requests = workdir / "run_batch_in.jsonl"
    requests.write_text("".join(json.dumps(line) + "\n"
                                for line in lines(args.requests, args.max_tokens)))
    out, log_path = workdir / "run_batch_out.jsonl", workdir / "run_batch.log"
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.run_batch", "-i", str(requests),
            "-o", str(out), "--model", str(model_dir), "--served-model-name", "tiny",
            "--max-model-len", "1024", "--dtype", args.dtype, "--max-num-seqs",
            str(args.max_num_seqs), "--disable-log-stats"]
    if args.device == "cpu":
        argv.append("--enforce-eager")
    started = ended = None
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        while proc.poll() is None or started is None or ended is None:
            text = log_path.read_text(errors="replace")
            if started is None and "Reading batch from" in text:
                started = time.perf_counter()
            if ended is None and "Writing outputs to" in text:
                ended = time.perf_counter()
            if proc.poll() is not None:
                break
            time.sleep(0.01)
    if proc.returncode != 0 or started is None or ended is None:
        raise RuntimeError(f"run_batch failed:\n{log_path.read_text()[-3000:]}")
    answers = [json.loads(row) for row in out.read_text().splitlines()]
    tokens = sum(a["response"]["body"]["usage"]["completion_tokens"] for a in answers)
    return Row("vLLM run_batch", len(answers), ended - started, tokens)


def end_to_end(model_dir: Path, args: argparse.Namespace, workdir: Path) -> Row:
    """The same requests as a quotaflow job on a real --deployment worker."""
    import psycopg
    import redis
    from sqlalchemy.engine import make_url

    from quotaflow.config import Settings
    from quotaflow.db import session_factory, upgrade
    from quotaflow.dispatch.queues import PlacingDispatcher
    from tests.harness.factories import jsonl
    from tests.harness.procs import Proc, quotaflow
    from tests.harness.servers import recreate_database, service_env
    from workers.dispatch import CeleryDispatcher

    recreate_database(PG_URL)
    upgrade(PG_URL)
    redis.Redis.from_url(REDIS_URL).flushdb()
    spec = deployment(model_dir, args)
    toml = workdir / "deployments.toml"
    fields = ("provider", "model", "engine", "model_path", "device", "dtype", "max_model_len",
              "max_num_seqs", "enforce_eager", "rpm", "tpm", "max_concurrency",
              "default_temperature", "engine_nice")
    toml.write_text(f"[deployments.{spec.name}]\n" + "".join(
        f"{k} = {json.dumps(getattr(spec, k))}\n" for k in fields)
        + f'[routes]\n"tiny" = "{spec.name}"\n')
    env = service_env(QUOTAFLOW_DATABASE_URL=PG_URL, QUOTAFLOW_BROKER_URL=REDIS_URL,
                      QUOTAFLOW_DEPLOYMENTS_FILE=str(toml), PYTHONPATH=str(ROOT),
                      VLLM_CACHE_ROOT=str(workdir / "vllm-cache"))
    argv = [sys.executable, *quotaflow("worker", "--deployment", spec.name, "--concurrency",
                                       str(args.worker_concurrency))[1:]]
    worker = Proc("bench-worker", argv, env, workdir)
    try:
        worker.wait_until(lambda: " ready." in worker.log(), timeout=600)
        settings = Settings(database_url=PG_URL, broker_url=REDIS_URL,
                            batch_size=args.job_batch_size, deployments_file=toml,
                            _env_file=None)
        sessions = session_factory(PG_URL)
        loaded = settings.load_deployments()
        dispatcher = PlacingDispatcher(CeleryDispatcher(REDIS_URL), sessions, loaded)
        poll_url = make_url(PG_URL).set(drivername="postgresql").render_as_string(
            hide_password=False)

        def run_job(data: bytes) -> tuple[str, float]:
            started = time.perf_counter()
            job = pipeline.create_job_in_process(
                sessions, io.BytesIO(data), settings=settings, deployments=loaded,
                dispatcher=dispatcher, queue="bulk")
            submitted = time.perf_counter() - started
            # Polled on a plain connection: reading the job through the ORM cost ~0.4 ms
            # of this process's CPU a time, 50 times a second, taken from the engine.
            with psycopg.connect(poll_url, autocommit=True) as poll:
                while (status := poll.execute("SELECT status FROM jobs WHERE id = %s",
                                              (job.id,)).fetchone()[0]) in ("validating",
                                                                            "in_progress"):
                    time.sleep(0.02)
            if status != "completed":
                raise RuntimeError(f"the job ended {status}:\n{worker.log()}")
            return job.id, submitted

        # A warm-up job first, as the in-process rows have their warm-up requests: a
        # deployed API and worker are long-running, and the first job of this process
        # paid its imports and first statements (about 0.1 s on a 5 s job).
        run_job(jsonl(lines(8, 4)))
        data = jsonl(lines(args.requests, args.max_tokens))
        started, wall = time.perf_counter(), time.time()
        job_id, submitted = run_job(data)
        seconds = time.perf_counter() - started
        from sqlalchemy import func, select

        from quotaflow.models import Result
        with sessions() as session:
            done, tokens, first_sent, last_answered = session.execute(select(
                func.count(), func.sum(Result.completion_tokens), func.min(Result.sent_at),
                func.max(Result.answered_at))
                .where(Result.job_id == job_id, Result.error.is_(None))).one()
        print(f"end to end, where the {seconds:.2f} s went: submitted (ingest, dispatch) "
              f"{submitted:.2f} s, first call sent at {first_sent.timestamp() - wall:.2f} s, "
              f"last answer at {last_answered.timestamp() - wall:.2f} s, job completed "
              f"(seen) at {seconds:.2f} s")
        return Row("quotaflow + vLLM engine (end to end)", done, seconds, int(tokens or 0))
    finally:
        worker.stop()


def flood(model_dir: Path, args: argparse.Namespace, policy: str) -> tuple[list[float], Row]:
    """Bulk requests all sent at once, realtime ones sent in one by one during the flood:
    the realtime latencies, and the bulk row."""
    provider = LocalProvider(deployment(model_dir, args, policy=policy))

    async def go() -> tuple[list, list]:
        bulk = [asyncio.ensure_future(_timed(provider, i, args.max_tokens * 2, QUEUE_BULK))
                for i in range(args.flood)]
        await asyncio.sleep(args.realtime_after_s)
        realtime = []
        for i in range(args.realtime):
            realtime.append(asyncio.ensure_future(
                _timed(provider, 10_000 + i, args.max_tokens // 4, QUEUE_REALTIME)))
            await asyncio.sleep(args.realtime_every_s)
        return await asyncio.gather(*realtime), await asyncio.gather(*bulk)

    started = time.perf_counter()
    realtime, bulk = asyncio.run(go())
    seconds = time.perf_counter() - started
    provider.runner.engine.close()
    from quotaflow.providers import local
    local._runners.clear()
    return ([t for t, _ in realtime],
            Row(f"bulk flood ({policy})", len(bulk), seconds, sum(n for _, n in bulk)))


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def print_rows(title: str, rows: list[Row], base: Row, reference: Row | None) -> None:
    print(f"\n{title}")
    header = ("mode", "requests", "seconds", "req/s", "tokens/s", "x one at a time",
              "of run_batch")
    table = [(r.mode, str(r.requests), f"{r.seconds:.2f}", f"{r.per_s:,.1f}",
              f"{r.completion_tokens / r.seconds:,.0f}", f"{r.per_s / base.per_s:.1f}x",
              f"{r.per_s / reference.per_s:.2f}" if reference else "-") for r in rows]
    widths = [max(len(row[i]) for row in [header, *table]) for i in range(len(header))]
    for row in [header, *table]:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda (vLLM's build decides)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--requests", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32,
                        help="the transformers engine's max_batch_size")
    parser.add_argument("--one-at-a-time", type=int, default=32,
                        help="requests of the one-at-a-time row (its rate is per request)")
    parser.add_argument("--job-batch-size", type=int, default=128,
                        help="QUOTAFLOW_BATCH_SIZE of the end-to-end job")
    parser.add_argument("--worker-concurrency", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=1,
                        help="run_batch and the end-to-end job, alternated this many times "
                             "(their rows are the medians)")
    parser.add_argument("--flood", type=int, default=256)
    parser.add_argument("--realtime", type=int, default=20)
    parser.add_argument("--realtime-after-s", type=float, default=0.5)
    parser.add_argument("--realtime-every-s", type=float, default=0.1)
    parser.add_argument("--only", choices=("throughput", "priority", "warm-start"))
    parser.add_argument("--first-requests", type=int, default=20,
                        help="requests of each burst of the warm-start rows")
    parser.add_argument("--engine-nice", type=int, default=19,
                        help="the deployment's engine_nice (0: the engine at the worker's "
                             "priority)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    import vllm
    print(f"vLLM {vllm.__version__}, device {args.device}, dtype {args.dtype}, "
          f"max_num_seqs {args.max_num_seqs}; {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory(prefix="qf-vllm-bench-") as directory:
        workdir = Path(directory)
        model_dir = write_model(workdir / "model")
        if args.only in (None, "throughput"):
            throughput(model_dir, args, workdir)
        if args.only in (None, "priority"):
            priorities(model_dir, args)
        if args.only in (None, "warm-start"):
            warm_start(deployment(model_dir, args), args, at_once)


def throughput(model_dir: Path, args: argparse.Namespace, workdir: Path) -> None:
    transformers = LocalProvider(deployment(model_dir, args, engine="transformers"))
    at_once(transformers, "warm-up", 8, 4)
    rows = [at_once(transformers, f"transformers engine (batch {args.batch_size})",
                    args.requests, args.max_tokens)]
    engine = LocalProvider(deployment(model_dir, args))
    at_once(engine, "warm-up", 8, 4)
    single = one_at_a_time(engine, args.one_at_a_time, args.max_tokens)
    rows.append(at_once(engine, "vLLM engine in process (no queue, no database)",
                        args.requests, args.max_tokens))
    engine.runner.engine.close()
    from quotaflow.providers import local
    local._runners.clear()
    # run_batch and the job alternate, round by round, so that both see the machine alike;
    # on a shared or throttled VM one round moves by a fifth either way, the medians less.
    references, jobs = [], []
    for number in range(1, args.rounds + 1):
        references.append(run_batch(model_dir, args, workdir))
        jobs.append(end_to_end(model_dir, args, workdir))
        if args.rounds > 1:
            print(f"round {number}: run_batch {references[-1].per_s:.1f} req/s, end to end "
                  f"{jobs[-1].per_s:.1f} req/s, {jobs[-1].per_s / references[-1].per_s:.2f} "
                  f"of run_batch", flush=True)
    reference, job = median_row(references), median_row(jobs)
    rows += [reference, job]
    rounds = f"; medians of {args.rounds} alternated rounds" if args.rounds > 1 else ""
    print_rows(f"{args.requests} chat requests, max_tokens {args.max_tokens}, greedy "
               f"(one at a time: {args.one_at_a_time}{rounds})", [single, *rows], single,
               reference)


def median_row(rows: list[Row]) -> Row:
    """The round of median rate (the lower middle one of an even count), as it ran."""
    return sorted(rows, key=lambda row: row.per_s)[(len(rows) - 1) // 2]


def priorities(model_dir: Path, args: argparse.Namespace) -> None:
    print(f"\n{args.flood} bulk requests (max_tokens {args.max_tokens * 2}) at once; "
          f"{args.realtime} realtime (max_tokens {args.max_tokens // 4}) one every "
          f"{args.realtime_every_s:g} s from {args.realtime_after_s:g} s on")
    header = ("scheduling", "realtime p50 s", "realtime p95 s", "realtime max s",
              "bulk seconds", "bulk req/s")
    table = []
    for policy in ("priority", "fcfs"):
        latencies, bulk = flood(model_dir, args, policy)
        table.append((policy, f"{statistics.median(latencies):.2f}",
                      f"{percentile(latencies, 0.95):.2f}", f"{max(latencies):.2f}",
                      f"{bulk.seconds:.2f}", f"{bulk.per_s:.1f}"))
    widths = [max(len(row[i]) for row in [header, *table]) for i in range(len(header))]
    for row in [header, *table]:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))


if __name__ == "__main__":
    main()
