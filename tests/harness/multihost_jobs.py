"""Jobs on the multi-host cluster (tests/harness/multihost_cluster.py), faults during them, and the
row each leaves in the table: scenario, 429s, of max, lost, duplicated, minutes.

- 429s: what the strict provider refused; any one means the shared budget was exceeded.
- of max: the requests the provider admitted over the most it could have admitted from
  the job's first admission to its last (a full bucket plus RPM x that time).
- lost: custom_ids with no line in the output.
- duplicated: custom_ids with more than one result, then (after the slash) requests the
  provider saw more than once (it counts each body's calls).
- minutes: from the upload to the job's end.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass

from tests.harness.cluster import (
    one_result_per_line,
    output_ids,
    results_stored,
    wait_until_finished,
)
from tests.harness.factories import chat_line, jsonl
from tests.harness.multihost_cluster import MultihostCluster

HEADER = ("scenario", "429s", "of max", "lost", "duplicated", "minutes")
ROWS: list["Row"] = []  # every job of the session, for the table at its end
REAPED = "items of dead workers or lost messages queued again"


@dataclass
class Row:
    scenario: str
    lines: int
    status: str
    rejected_429: int
    of_max: float
    lost: int
    duplicated_results: int
    sent_twice: int
    seconds: float
    reaped: int  # reaper rounds that queued items again, in every worker's log
    notes: dict[str, object]

    def cells(self) -> tuple[str, ...]:
        return (self.scenario, str(self.rejected_429), f"{self.of_max:.3f}", str(self.lost),
                f"{self.duplicated_results}/{self.sent_twice}", f"{self.seconds / 60:.2f}")


def table(rows: list[Row]) -> str:
    return table_of_cells([row.cells() for row in rows])


def table_of_cells(rows: list[tuple[str, ...]]) -> str:
    """The table from rows' cells (what an xdist worker hands its controller)."""
    cells = [HEADER, *rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(HEADER))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True))
                     for line in cells)


def reaped(cluster: MultihostCluster) -> int:
    return sum(proc.log_path.read_text(errors="replace").count(REAPED)
               for procs in cluster.workers.values() for proc in procs)


def wait_for_results(cluster: MultihostCluster, job_id: str, count: int,
                     timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while results_stored(cluster.sessions(), job_id) < count:
        assert time.monotonic() < deadline, f"fewer than {count} results after {timeout}s"
        time.sleep(0.2)


def run_job(cluster: MultihostCluster, name: str, lines: int,
            during: Callable[[str, dict[str, object]], None] | None = None,
            timeout: float = 240) -> Row:
    """Upload a job of `lines` distinct requests through the API on host A, run `during`
    (the faults) while it runs, wait for its end; its row.

    Both buckets (the provider's and the limiter's) are left to fill first, so every
    job starts from the same full budget.
    """
    time.sleep(cluster.budget.burst_seconds + 1)
    with cluster.provider() as provider:
        provider.post("/stats/reset").raise_for_status()
    reaped_before = reaped(cluster)
    data = jsonl([chat_line(f"{name}-{i}", prompt=f"{name}: question {i}") for i in range(lines)])
    started = time.monotonic()
    with cluster.api() as api:
        answer = api.post("/jobs", files={"file": (f"{name}.jsonl", data)},
                          data={"queue": "realtime"})
    assert answer.status_code == 201, answer.text
    job_id = answer.json()["id"]
    notes: dict[str, object] = {}
    if during is not None:
        during(job_id, notes)
    sessions = cluster.sessions()
    status = wait_until_finished(sessions, job_id, started, timeout, lines)
    seconds = time.monotonic() - started
    with cluster.provider() as provider:
        stats = provider.get("/stats").json()
    results, distinct = one_result_per_line(sessions, job_id)
    ids = output_ids(sessions, job_id)
    expected = {f"{name}-{i}" for i in range(lines)}
    budget = cluster.budget
    window = (stats["last_admitted_at"] or 0) - (stats["first_admitted_at"] or 0)
    return Row(scenario=name, lines=lines, status=status, rejected_429=stats["rejected_429"],
               of_max=stats["admitted"] / (budget.request_capacity + budget.rpm / 60 * window),
               lost=len(expected - set(ids)),
               duplicated_results=results - distinct + len(ids) - len(set(ids)),
               sent_twice=stats["duplicate_bodies"], seconds=seconds,
               reaped=reaped(cluster) - reaped_before, notes={**notes, "stats": stats})


def cut_b(routes: list[str], seconds: float, at: int, label: str,
          mid_transaction: bool = False
          ) -> Callable[[MultihostCluster, str, dict[str, object]], None]:
    """A partition: host B's proxy blocks `routes` for `seconds` once the job has `at`
    results; the notes say how far the job got meanwhile and whether the provider
    refused anything while B was cut off.

    `mid_transaction`: the cut is made the moment one of B's transactions is seen open, and
    healed and made again until it has caught one with another worker waiting for its locks
    (the job's spend row, which every result write takes): the worst moment."""
    def fault(cluster: MultihostCluster, job_id: str, notes: dict[str, object]) -> None:
        wait_for_results(cluster, job_id, at)
        sessions = cluster.sessions()
        if mid_transaction:
            notes[f"cuts until one caught B mid-transaction ({label})"] = _cut_mid_transaction(
                cluster, routes)
        else:
            cluster.control("b", block=routes)
        before = results_stored(sessions, job_id)
        try:
            time.sleep(seconds)
        finally:
            cluster.control("b", block=[])
        with cluster.provider() as provider:
            notes[f"429s while {label}"] = provider.get("/stats").json()["rejected_429"]
        notes[f"results while {label}"] = results_stored(sessions, job_id) - before
    return fault


def _cut_mid_transaction(cluster: MultihostCluster, routes: list[str]) -> int | None:
    """Cut B off as one of its transactions is open, until a cut leaves another session
    waiting for that transaction's locks (seen within the 3 s PostgreSQL gives an idle
    transaction); the number of cuts it took, None if none caught one (the last cut
    stands all the same)."""
    for tries in range(1, 41):
        _until(lambda: cluster.open_transactions("b") > 0, seconds=2.0)
        cluster.control("b", block=routes)
        if _until(lambda: cluster.blocking_transactions("b") > 0, seconds=2.0):
            return tries
        cluster.control("b", block=[])
        time.sleep(0.3)
    cluster.control("b", block=routes)
    return None


def _until(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


def in_turn(cluster: MultihostCluster,
            *faults: Callable[[MultihostCluster, str, dict[str, object]], None]
            ) -> Callable[[str, dict[str, object]], None]:
    def during(job_id: str, notes: dict[str, object]) -> None:
        for fault in faults:
            fault(cluster, job_id, notes)
    return during
