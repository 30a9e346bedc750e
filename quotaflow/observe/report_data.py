"""What a job's report shows, read from its results' provenance (migration 0009).

Everything is aggregated in PostgreSQL into time buckets, so a million-line job's
report reads a few hundred rows, not a million. A bucket's width is chosen from the
job's span (at most MAX_BUCKETS of them, of a round number of seconds); rates are
per minute whatever the width, so they read against a deployment's RPM/TPM.
"""

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from quotaflow import store
from quotaflow.deployments.catalog import Deployments
from quotaflow.errors import ConfigError
from quotaflow.jobs import view as job_view
from quotaflow.jobs.service import get_job
from quotaflow.observe.bound import Bound

MAX_BUCKETS = 60
WIDTHS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400)
EXAMPLES_PER_CODE = 3


def bucket_width(span_s: float) -> int:
    """The narrowest round width that cuts the span into MAX_BUCKETS buckets or fewer."""
    return next((w for w in WIDTHS_S if span_s / w <= MAX_BUCKETS), WIDTHS_S[-1])


@dataclass
class Series:
    """One plotted line: bucket starts (Unix seconds) and values."""

    name: str
    x: list[float] = field(default_factory=list)
    y: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "x": self.x, "y": self.y}


@dataclass
class ReportData:
    job: dict[str, Any]  # the batch object (job_view): status, counts, usage
    bucket_s: int
    requests_per_min: list[Series]  # admitted, per deployment
    tokens_per_min: list[Series]  # admitted (tokens used), per deployment
    outcomes_per_min: list[Series]  # completed, failed (by when they were answered)
    latency_s: list[Series]  # p50, p95 of answered - sent
    budgets: dict[str, tuple[int, int]]  # deployment -> (rpm, tpm)
    errors: list[dict[str, Any]]  # {code, count, examples: [{line, custom_id, message}]}
    split: list[dict[str, Any]]  # per deployment: requests, succeeded, tokens, mean latency
    bound: Bound | None = None  # what bound the job (bound.py), where the caller read it


SPAN = """
SELECT min(coalesce(admitted_at, created_at)), max(coalesce(answered_at, created_at))
FROM results WHERE job_id = :job"""

# floor(epoch / w) * w: the bucket's start, in Unix seconds.
ADMITTED = """
SELECT deployment, floor(extract(epoch FROM admitted_at) / :w) * :w AS t,
       count(*), sum(prompt_tokens + completion_tokens)
FROM results WHERE job_id = :job AND admitted_at IS NOT NULL
GROUP BY deployment, t ORDER BY deployment, t"""

OUTCOMES = """
SELECT floor(extract(epoch FROM coalesce(answered_at, created_at)) / :w) * :w AS t,
       count(*) FILTER (WHERE error IS NULL), count(*) FILTER (WHERE error IS NOT NULL)
FROM results WHERE job_id = :job GROUP BY t ORDER BY t"""

LATENCY = """
SELECT floor(extract(epoch FROM answered_at) / :w) * :w AS t,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM answered_at - sent_at)),
       percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM answered_at - sent_at))
FROM results WHERE job_id = :job AND answered_at IS NOT NULL GROUP BY t ORDER BY t"""

ERRORS = """
SELECT code, count, examples FROM (
  SELECT error->>'code' AS code, count(*) OVER (PARTITION BY error->>'code') AS count,
         row_number() OVER (PARTITION BY error->>'code' ORDER BY line_no) AS n,
         json_agg(json_build_object('line', line_no, 'custom_id', custom_id,
                                    'message', error->>'message'))
           OVER (PARTITION BY error->>'code' ORDER BY line_no) AS examples
  FROM results WHERE job_id = :job AND error IS NOT NULL) coded
WHERE n = least(count, :examples) ORDER BY count DESC, code"""

SPLIT = """
SELECT coalesce(deployment, '(not sent)'), count(*), count(*) FILTER (WHERE error IS NULL),
       sum(prompt_tokens), sum(completion_tokens),
       avg(extract(epoch FROM answered_at - sent_at))
FROM results WHERE job_id = :job GROUP BY 1 ORDER BY 2 DESC"""


def budgets(deployments: Deployments) -> dict[str, tuple[int, int]]:
    """Each deployment's (rpm, tpm), the lines its admissions are drawn against."""
    return {name: (d.rpm, d.tpm) for name, d in deployments.deployments.items()}


def report_data(session: Session, job_id: str, budgets: dict[str, tuple[int, int]],
                tenant: str | None = None) -> ReportData:
    """The job's report, its series in buckets; `budgets` are the deployments' (rpm, tpm)."""
    if not store.of(session).aggregates:
        raise ConfigError("the job report reads its series with PostgreSQL's aggregates; "
                          "run it against a PostgreSQL QUOTAFLOW_DATABASE_URL")
    job = job_view.job_object(session, get_job(session, job_id, tenant))
    first, last = session.execute(text(SPAN), {"job": job_id}).one()
    width = bucket_width((last - first).total_seconds() if first and last else 0.0)
    args = {"job": job_id, "w": width}
    per_min = 60.0 / width
    requests: dict[str, Series] = {}
    tokens: dict[str, Series] = {}
    for name, start, count, used in session.execute(text(ADMITTED), args):
        requests.setdefault(name, Series(name)).x.append(float(start))
        requests[name].y.append(count * per_min)
        tokens.setdefault(name, Series(name)).x.append(float(start))
        tokens[name].y.append(int(used or 0) * per_min)
    completed, failed = Series("completed"), Series("failed")
    for start, ok, bad in session.execute(text(OUTCOMES), args):
        for series, value in ((completed, ok), (failed, bad)):
            series.x.append(float(start))
            series.y.append(value * per_min)
    p50, p95 = Series("p50"), Series("p95")
    for start, median, high in session.execute(text(LATENCY), args):
        for series, value in ((p50, median), (p95, high)):
            series.x.append(float(start))
            series.y.append(round(float(value), 6))
    errors = [{"code": code, "count": count, "examples": examples}
              for code, count, examples in session.execute(
                  text(ERRORS), {"job": job_id, "examples": EXAMPLES_PER_CODE})]
    split = [{"deployment": name, "requests": count, "succeeded": ok,
              "prompt_tokens": int(prompt or 0), "completion_tokens": int(completion or 0),
              "mean_latency_s": None if mean is None else float(mean)}
             for name, count, ok, prompt, completion, mean in session.execute(
                 text(SPLIT), {"job": job_id})]
    used = {s["deployment"] for s in split}
    return ReportData(job, width, list(requests.values()), list(tokens.values()),
                      [completed, failed], [p50, p95],
                      {name: budget for name, budget in budgets.items() if name in used},
                      errors, split)


def when(unix: float | None) -> str:
    """A Unix time as the report prints it (UTC, to the second)."""
    if unix is None:
        return "-"
    return datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
