"""Simulated API clients for load tests: pollers reading a job's status and submitters
making small realtime jobs and waiting for them to complete.

Each client is one aiohttp session with one keep-alive connection, as a user's script
or console tab is; every loop ends at a deadline or a request cap, whichever comes
first, and every request has a client timeout. A refusal is counted as an error and
then honoured: the client waits out its Retry-After before it asks again. A crowd can
be spread over several processes (`run_crowd`) when one Python process cannot drive
it: each process reports the CPU it spent, so a saturated load generator shows.
"""

import asyncio
import json
import random
import resource
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context

import aiohttp

FINAL = {"completed", "failed", "cancelled", "expired"}
POLL_EVERY_S = 0.1  # a submitter's polling interval where the server has no long-poll
LONG_POLL_S = 5  # a long-poll's wait, where the server offers one


@dataclass
class Crowd:
    """What a crowd of clients is told: where, as whom, for how long."""

    api_url: str
    headers: dict[str, str]
    seconds: float
    max_requests: int  # per client: the cap beside the deadline
    timeout_s: float = 10.0
    job_id: str = ""  # pollers: the job they read
    body: bytes = b""  # submitters: the JSONL each job is made of
    lines: int = 0  # submitters: lines per job, the results each must end with
    settle_s: float = 60.0  # submitters: how long a job may take to complete after its POST
    long_poll: bool = False  # submitters: GET /jobs/{id}?wait= answers on a change
    paths: tuple[str, ...] = ()  # pollers: other paths to read (the generator's own ceiling)
    every_s: float = 0.0  # seconds between reads, or jobs (a watch's interval); 0: back to back


@dataclass
class Tally:
    """Latencies (seconds) of the answered requests and errors by kind."""

    latencies: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    in_window: int = 0  # successes that ended before the deadline: the rate's numerator
    cpu_s: float = 0.0  # the load generator's own CPU (all its processes)

    def merge(self, other: "Tally") -> None:
        self.latencies += other.latencies
        self.errors.update(other.errors)
        self.in_window += other.in_window
        self.cpu_s += other.cpu_s

    def percentile(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    def error_text(self) -> str:
        return ", ".join(f"{n} x {kind}" for kind, n in self.errors.most_common()) or "0"


@dataclass
class SubmitTally:
    """The submitters' view: creation requests, each job's submit-to-completed time, and
    every job made with its last request_counts (None where it never finished in time)."""

    create: Tally = field(default_factory=Tally)
    done: list[float] = field(default_factory=list)
    jobs: dict[str, dict | None] = field(default_factory=dict)

    def merge(self, other: "SubmitTally") -> None:
        self.create.merge(other.create)
        self.done += other.done
        self.jobs |= other.jobs

    def done_percentile(self, q: float) -> float:
        return Tally(self.done).percentile(q)


def _error_kind(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, aiohttp.ClientConnectionError):
        return f"connection ({type(exc).__name__})"
    return type(exc).__name__


def _status_kind(response: aiohttp.ClientResponse, what: str) -> str:
    retry = " with Retry-After" if "Retry-After" in response.headers else ""
    return f"{what} HTTP {response.status}{retry}"


async def _back_off(response: aiohttp.ClientResponse, until: float) -> None:
    """Wait as the answer's Retry-After asks (never past `until`), as SDK clients do: a
    client that asks again at once only adds to the load that was refused."""
    try:
        seconds = float(response.headers.get("Retry-After", "0"))
    except ValueError:
        seconds = 0.0
    await asyncio.sleep(max(0.0, min(seconds, until - time.monotonic())))


def _session(crowd: Crowd) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=1, force_close=False),
        timeout=aiohttp.ClientTimeout(total=crowd.timeout_s), headers=crowd.headers)


async def _poller(crowd: Crowd, index: int, deadline: float, tally: Tally) -> None:
    """GET /jobs/{id} and /v1/batches/{id} in turn until the deadline, back to back or one
    every `every_s` seconds (started at a random phase, as independent watchers are)."""
    paths = crowd.paths or (f"/jobs/{crowd.job_id}", f"/v1/batches/{crowd.job_id}")
    async with _session(crowd) as session:
        if crowd.every_s:
            await asyncio.sleep(random.uniform(0, crowd.every_s))
        previous = time.monotonic()
        for n in range(crowd.max_requests):
            if time.monotonic() >= deadline:
                return
            started = time.monotonic()
            if crowd.every_s and n:
                await asyncio.sleep(max(0.0, crowd.every_s - (started - previous)))
                started = time.monotonic()
            previous = started
            try:
                path = paths[(index + n) % len(paths)]
                async with session.get(crowd.api_url + path) as response:
                    await response.read()
                    if response.status != 200:
                        tally.errors[_status_kind(response, "read")] += 1
                        await _back_off(response, deadline)
                        continue
            except (aiohttp.ClientError, TimeoutError) as exc:
                tally.errors[f"read {_error_kind(exc)}"] += 1
                continue
            ended = time.monotonic()
            tally.latencies.append(ended - started)
            tally.in_window += ended <= deadline


async def _wait_final(session: aiohttp.ClientSession, crowd: Crowd, job_id: str,
                      until: float, tally: SubmitTally) -> dict | None:
    """The job's object once it is final (None if `until` passes first)."""
    query = f"?wait={LONG_POLL_S}" if crowd.long_poll else ""
    while time.monotonic() < until:
        try:
            async with session.get(f"{crowd.api_url}/jobs/{job_id}{query}") as response:
                if response.status == 200:
                    job = json.loads(await response.read())
                    if job["status"] in FINAL:
                        return job
                else:
                    await response.read()
                    tally.create.errors[_status_kind(response, "poll")] += 1
                    await _back_off(response, until)
        except (aiohttp.ClientError, TimeoutError) as exc:
            tally.create.errors[f"poll {_error_kind(exc)}"] += 1
        if not crowd.long_poll:
            await asyncio.sleep(POLL_EVERY_S)
    return None


async def _submitter(crowd: Crowd, deadline: float, tally: SubmitTally) -> None:
    """Make a small realtime job, wait for it to finish, again, until the deadline; with
    `every_s`, a job at most every `every_s` seconds (from a random phase)."""
    url = f"{crowd.api_url}/jobs/jsonl?queue=realtime"
    headers = {"Content-Type": "application/jsonl"}
    async with _session(crowd) as session:
        if crowd.every_s:
            await asyncio.sleep(random.uniform(0, crowd.every_s))
        previous = time.monotonic()
        for n in range(crowd.max_requests):
            if time.monotonic() >= deadline:
                return
            if crowd.every_s and n:
                await asyncio.sleep(max(0.0, crowd.every_s - (time.monotonic() - previous)))
            started = previous = time.monotonic()
            try:
                async with session.post(url, data=crowd.body, headers=headers) as response:
                    raw = await response.read()
                    if response.status != 201:
                        tally.create.errors[_status_kind(response, "create")] += 1
                        await _back_off(response, deadline)
                        continue
            except (aiohttp.ClientError, TimeoutError) as exc:
                tally.create.errors[f"create {_error_kind(exc)}"] += 1
                continue
            created = time.monotonic()
            tally.create.latencies.append(created - started)
            tally.create.in_window += created <= deadline
            job_id = json.loads(raw)["id"]
            job = await _wait_final(session, crowd, job_id, created + crowd.settle_s, tally)
            tally.jobs[job_id] = None if job is None else job["request_counts"]
            if job is not None and job["status"] == "completed":
                tally.done.append(time.monotonic() - started)


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _crowd(kind: str, crowd: Crowd, clients: range) -> Tally | SubmitTally:
    deadline = time.monotonic() + crowd.seconds
    if kind == "poll":
        tally = Tally()
        await asyncio.gather(*(_poller(crowd, n, deadline, tally) for n in clients))
        return tally
    submitted = SubmitTally()
    await asyncio.gather(*(_submitter(crowd, deadline, submitted) for _ in clients))
    return submitted


def _crowd_in_process(kind: str, crowd: Crowd, clients: range) -> Tally | SubmitTally:
    cpu = _cpu()
    result = asyncio.run(_crowd(kind, crowd, clients))
    (result if isinstance(result, Tally) else result.create).cpu_s = _cpu() - cpu
    return result


def run_crowd(kind: str, crowd: Crowd, clients: int, processes: int = 1) -> Tally | SubmitTally:
    """`clients` pollers (kind "poll") or submitters ("submit") for `crowd.seconds`, in
    `processes` processes (each runs its share of the clients on one event loop)."""
    return run_crowds([(kind, crowd, clients)], processes)[0]


def run_crowds(crowds: list[tuple[str, Crowd, int]],
               processes: int = 1) -> list[Tally | SubmitTally]:
    """Several crowds at once, each split over `processes` forked processes (one crowd in
    one process runs here); their tallies in the same order."""
    parts = [(index, kind, crowd, range(start, clients, processes))
             for index, (kind, crowd, clients) in enumerate(crowds)
             for start in range(min(processes, clients))]
    if len(parts) == 1:
        return [_crowd_in_process(*parts[0][1:])]
    totals: list[Tally | SubmitTally] = [Tally() if kind == "poll" else SubmitTally()
                                         for kind, _, _ in crowds]
    with ProcessPoolExecutor(len(parts), mp_context=get_context("fork")) as pool:
        futures = [(index, pool.submit(_crowd_in_process, kind, crowd, share))
                   for index, kind, crowd, share in parts]
        for index, future in futures:
            totals[index].merge(future.result())
    return totals
