"""Ingest benchmark: a large OpenAI batch file through `quotaflow submit` into a job, and
its results back out through `quotaflow results`, on a real API process.

    python -m bench.ingest                  # 1,000,000 lines of about 400 bytes
    python -m bench.ingest --lines 100000   # a quicker run

It writes the file to a temporary directory, starts its own API (`quotaflow api`,
QUOTAFLOW_AUTH=false, PostgreSQL database quotaflow_ingest_bench, recreated; broker
on Redis db 12, where the job's Celery messages land: no workers run, and the db is
emptied at the end), and times the CLI's upload until it prints the job id: upload,
parse, validate, token count, COPY, commit and dispatch. Then every item is marked
done by inserting a result for it with SQL (a chat.completion body of about 400
bytes; not timed), and the CLI downloads the results stream to a file. The API's
peak RSS is its VmHWM from /proc.
"""

import argparse
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson
import psycopg
import redis
from sqlalchemy.engine import make_url

from quotaflow.db import upgrade

PG_URL = os.environ.get("QUOTAFLOW_BENCH_DATABASE_URL",
                        "postgresql+psycopg://postgres@127.0.0.1:5432/quotaflow_ingest_bench")
REDIS_URL = os.environ.get("QUOTAFLOW_BENCH_REDIS_URL", "redis://127.0.0.1:6379/12")
ROOT = Path(__file__).resolve().parent.parent
WORDS = ["batch", "quota", "token", "stream", "ingest", "summarise", "translate", "review",
         "contract", "invoice", "customer", "ticket", "weather", "river", "mountain", "library",
         "garden", "engine", "signal", "market", "harbour", "lantern", "meadow", "orbit",
         "pepper", "quartz", "saddle", "timber", "velvet", "willow"]
# A chat.completion as providers answer (about 400 bytes), made by PostgreSQL per line.
RESULT_SQL = """
INSERT INTO results (job_id, line_no, custom_id, request_id, status_code, response,
                     prompt_tokens, completion_tokens, created_at)
SELECT job_id, line_no, custom_id, 'batch_req_' || md5(line_no::text), 200,
       jsonb_build_object(
         'id', 'chatcmpl-' || md5(custom_id), 'object', 'chat.completion',
         'created', 1764000000, 'model', 'gpt-4o-mini-2024-07-18',
         'choices', jsonb_build_array(jsonb_build_object(
           'index', 0, 'finish_reason', 'stop', 'logprobs', NULL,
           'message', jsonb_build_object('role', 'assistant', 'content',
             'The answer to request ' || custom_id || ' is a short paragraph of text '
             || 'that a model wrote back, about as long as a typical reply.'))),
         'usage', jsonb_build_object('prompt_tokens', 80, 'completion_tokens', 40,
                                     'total_tokens', 120),
         'system_fingerprint', 'fp_bench'),
       80, 40, now()
FROM items WHERE job_id = %(job)s
"""


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in
                  Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor() or "unknown CPU")
    memory = next((int(line.split()[1]) // 1024 // 1024 for line in
                   Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal")), 0)
    return (f"{platform.machine()}, {os.cpu_count()} cores ({model}), {memory} GiB, "
            f"Python {platform.python_version()}")


def write_file(path: Path, lines: int) -> int:
    """An OpenAI batch file of chat requests, about 400 bytes a line, every prompt unique."""
    rng = random.Random(7)
    with path.open("wb") as out:
        for start in range(0, lines, 10_000):
            chunk = []
            for n in range(start, min(lines, start + 10_000)):
                prompt = f"Request {n}: " + " ".join(rng.choices(WORDS, k=23))
                chunk.append(orjson.dumps({
                    "custom_id": f"request-{n:07d}", "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": {"model": "gpt-4o-mini", "max_tokens": 256, "temperature": 0.2,
                             "messages": [{"role": "system", "content": "Answer briefly."},
                                          {"role": "user", "content": prompt}]}}))
            out.write(b"\n".join(chunk) + b"\n")
    return path.stat().st_size


def recreate_database() -> None:
    url = make_url(PG_URL)
    admin = url.set(drivername="postgresql", database="postgres")
    with psycopg.connect(admin.render_as_string(hide_password=False), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{url.database}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{url.database}"')
    upgrade(PG_URL)


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def postmaster_pid(dsn: str) -> int:
    """The PostgreSQL server's own pid (its backends are its children), for its CPU."""
    with psycopg.connect(dsn) as conn:
        backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    stat = Path(f"/proc/{backend}/stat").read_bytes()
    return int(stat[stat.rindex(b")") + 2:].split()[1])


def cpu_s(pids: list[int]) -> float:
    """CPU seconds of the process trees under pids (bench.e2e's accounting)."""
    from bench.e2e import _process_table, tree_cpu
    return tree_cpu(pids, _process_table())


def timed(command: list[str], env: dict[str, str], watched: list[int]
          ) -> tuple[subprocess.CompletedProcess[str], float, list[float]]:
    """Run a CLI command to its end: its result, wall seconds, and the CPU seconds it,
    then each watched process tree, used meanwhile."""
    before = [cpu_s([pid]) for pid in watched]
    child_before = os.times()
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    child_after = os.times()
    used = [child_after.children_user + child_after.children_system
            - child_before.children_user - child_before.children_system]
    used += [cpu_s([pid]) - b for pid, b in zip(watched, before, strict=True)]
    return done, wall, used


def quotaflow(*args: str) -> list[str]:
    return [sys.executable, "-c", "from cli.main import main; main()", *args]


def run(lines: int, workdir: Path, port: int | None = None) -> dict[str, float]:
    source = workdir / "batch.jsonl"
    size = write_file(source, lines)
    print(f"input: {lines:,} lines, {size / 1e6:,.0f} MB ({size / lines:.0f} bytes a line)")
    recreate_database()
    port = port or 18000 + os.getpid() % 1000
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUOTAFLOW_")}
    env |= {"QUOTAFLOW_DATABASE_URL": PG_URL, "QUOTAFLOW_BROKER_URL": REDIS_URL,
            "QUOTAFLOW_AUTH": "false", "QUOTAFLOW_API_URL": f"http://127.0.0.1:{port}",
            "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    log = (workdir / "api.log").open("wb")
    api = subprocess.Popen(quotaflow("api", "--port", str(port)), env=env, stdout=log,
                           stderr=subprocess.STDOUT, start_new_session=True)
    try:
        for _ in range(300):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        idle_rss = peak_rss_mb(api.pid)
        dsn = make_url(PG_URL).set(drivername="postgresql").render_as_string(hide_password=False)
        watched = [api.pid, postmaster_pid(dsn)]
        made, submit_s, submit_cpu = timed(quotaflow("submit", str(source), "--queue", "bulk"),
                                           env, watched)
        if made.returncode != 0:
            raise SystemExit(f"submit failed: {made.stderr}\n{(workdir / 'api.log').read_text()}")
        job_id = made.stdout.strip()
        submit_rss = peak_rss_mb(api.pid)
        queued = redis.Redis.from_url(REDIS_URL).llen("bulk")
        with psycopg.connect(make_url(PG_URL).set(drivername="postgresql")
                             .render_as_string(hide_password=False)) as conn:
            conn.execute(RESULT_SQL, {"job": job_id})
            conn.execute("UPDATE items SET status = 'succeeded' WHERE job_id = %s", (job_id,))
            conn.execute("UPDATE jobs SET status = 'completed', completed_at = now() "
                         "WHERE id = %s", (job_id,))
        conn.close()
        output = workdir / "results.jsonl"
        got, download_s, download_cpu = timed(quotaflow("results", job_id, "-o", str(output)),
                                              env, watched)
        if got.returncode != 0:
            raise SystemExit(f"results failed: {got.stderr}")
        with output.open("rb") as handle:
            first = orjson.loads(handle.readline())
            downloaded = 1 + sum(1 for _ in handle)
        assert downloaded == lines, (downloaded, lines)
        assert first["custom_id"] == "request-0000000" and first["response"]["status_code"] == 200
        return {"lines": lines, "submit_s": submit_s, "idle_rss": idle_rss,
                "submit_rss": submit_rss, "peak_rss": peak_rss_mb(api.pid),
                "download_s": download_s, "download_mb": output.stat().st_size / 1e6,
                "queued": queued, "submit_cpu": submit_cpu, "download_cpu": download_cpu}
    finally:
        os.killpg(api.pid, 15)
        api.wait(30)
        log.close()
        redis.Redis.from_url(REDIS_URL).flushdb()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--keep-database", action="store_true",
                        help="Leave quotaflow_ingest_bench for a look (it is about 1 GB per "
                             "million lines); dropped otherwise.")
    parser.add_argument("--port", type=int, default=None,
                        help="The API's port (default: 18000 + the pid modulo 1000). The "
                             "database and Redis db: QUOTAFLOW_BENCH_DATABASE_URL and "
                             "QUOTAFLOW_BENCH_REDIS_URL.")
    args = parser.parse_args()
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory(prefix="qf-ingest-") as workdir:
        row = run(args.lines, Path(workdir), args.port)
    if not args.keep_database:
        url = make_url(PG_URL)
        admin = url.set(drivername="postgresql", database="postgres")
        with psycopg.connect(admin.render_as_string(hide_password=False),
                             autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{url.database}" WITH (FORCE)')
    print(f"{row['queued']:,} Celery messages queued; API RSS idle {row['idle_rss']:.0f} MB, "
          f"after submit {row['submit_rss']:.0f} MB; results file {row['download_mb']:,.0f} MB")
    for phase in ("submit", "download"):
        cli, api, pg = row[f"{phase}_cpu"]
        print(f"{phase} CPU us a line: CLI {cli / row['lines'] * 1e6:.1f}, API "
              f"{api / row['lines'] * 1e6:.1f}, PostgreSQL {pg / row['lines'] * 1e6:.1f} "
              "(the whole server: anything else it runs counts too)")
    header = ("lines", "submit s", "lines/s", "API peak RSS MB", "download s",
              "download lines/s")
    values = (f"{row['lines']:,}", f"{row['submit_s']:.1f}",
              f"{row['lines'] / row['submit_s']:,.0f}", f"{row['peak_rss']:.0f}",
              f"{row['download_s']:.1f}", f"{row['lines'] / row['download_s']:,.0f}")
    widths = [max(len(h), len(v)) for h, v in zip(header, values, strict=True)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    print("  ".join(v.ljust(w) for v, w in zip(values, widths, strict=True)))


if __name__ == "__main__":
    main()
