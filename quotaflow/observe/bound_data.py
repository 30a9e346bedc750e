"""A job's timeline for quotaflow/observe/bound.py, read from its results' provenance.

Aggregated in PostgreSQL into the report's buckets (report_data.bucket_width), so a
million-line job reads a few hundred rows: admissions per deployment and bucket, and
the seconds its calls spent in flight in each bucket (a call is cut at the buckets'
edges, so a long call counts in every bucket it spans).
"""

from sqlalchemy import text
from sqlalchemy.orm import Session

from quotaflow import store
from quotaflow.config import Settings
from quotaflow.deployments.catalog import Deployments
from quotaflow.errors import ConfigError
from quotaflow.jobs.service import get_job
from quotaflow.models import JobStatus
from quotaflow.observe.bound import Bound, Limits, Slice, Timeline, Use, classify
from quotaflow.observe.report_data import bucket_width

SPAN = """
SELECT extract(epoch FROM j.created_at), extract(epoch FROM min(r.admitted_at)),
       extract(epoch FROM max(coalesce(r.answered_at, r.created_at))), extract(epoch FROM now())
FROM jobs j LEFT JOIN results r ON r.job_id = j.id WHERE j.id = :job GROUP BY j.created_at"""

ADMITS = """
SELECT deployment, floor((extract(epoch FROM admitted_at) - :first) / :w)::int AS k,
       count(*), sum(prompt_tokens), sum(completion_tokens),
       count(*) FILTER (WHERE attempts > 1)
FROM results WHERE job_id = :job AND admitted_at IS NOT NULL AND deployment IS NOT NULL
GROUP BY 1, 2"""

FLIGHT = """
SELECT deployment, k, sum(greatest(0.0, least(a, :first + (k + 1) * :w)
                                        - greatest(s, :first + k * :w)))
FROM (SELECT deployment, extract(epoch FROM sent_at)::float8 AS s,
             extract(epoch FROM answered_at)::float8 AS a
      FROM results WHERE job_id = :job AND sent_at IS NOT NULL AND answered_at IS NOT NULL
        AND deployment IS NOT NULL) calls,
     generate_series(floor((s - :first) / :w)::int, floor((a - :first) / :w)::int) AS k
GROUP BY 1, 2"""

ROUTES = "SELECT DISTINCT route FROM items WHERE job_id = :job AND route IS NOT NULL"


def limits(deployments: Deployments, floor: float) -> dict[str, Limits]:
    """Each deployment's limits, at the job's queue's floor."""
    found = {}
    for name, d in deployments.deployments.items():
        split = d.itpm is not None and d.otpm is not None
        found[name] = Limits(name, d.rpm, 0.0 if split else d.tpm, float(d.itpm or 0),
                             float(d.otpm or 0), d.burst_seconds, floor, d.max_concurrency)
    return found


def timeline(session: Session, job_id: str, deployments: Deployments, settings: Settings,
             tenant: str | None = None) -> Timeline:
    """The job's slices, from its creation to its last answer (to now while it runs)."""
    if not store.of(session).aggregates:
        raise ConfigError("what bound a job is read with PostgreSQL's aggregates; run it "
                          "against a PostgreSQL QUOTAFLOW_DATABASE_URL")
    job = get_job(session, job_id, tenant)
    created, first, last, now = (float(v) if v is not None else None for v in
                                 session.execute(text(SPAN), {"job": job_id}).one())
    assert created is not None and now is not None
    end = last if job.status in JobStatus.FINAL and last is not None else now
    route = sorted({d for name in session.scalars(text(ROUTES), {"job": job_id})
                    if (r := deployments.route_named(name)) is not None
                    for d in r.deployments})
    found = Timeline(0.0, [], limits(deployments, settings.floor_for(job.queue)), job.queue,
                     route)
    if first is None:
        found.queued_s = max(0.0, end - created)
        return found
    found.queued_s = max(0.0, first - created)
    width = float(bucket_width(max(0.0, end - first)))
    count = max(1, int((end - first) // width) + 1)
    found.slices = [Slice(found.queued_s + k * width, width) for k in range(count)]
    args = {"job": job_id, "first": first, "w": width}
    for name, k, requests, prompt, completion, retried in session.execute(text(ADMITS), args):
        if 0 <= k < count:
            found.slices[k].use[name] = Use(requests, int(prompt or 0), int(completion or 0),
                                            retried)
    # The last slice is cut short by the end.
    found.slices[-1].width = max(1e-3, min(width, end - first - width * (count - 1)))
    for name, k, busy in session.execute(text(FLIGHT), args):
        if 0 <= k < count:
            found.slices[k].in_flight[name] = float(busy) / found.slices[k].width
    return found


def job_bound(session: Session, job_id: str, deployments: Deployments, settings: Settings,
              tenant: str | None = None) -> Bound:
    return classify(timeline(session, job_id, deployments, settings, tenant))
