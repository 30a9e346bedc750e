"""What the jobs console (api/console/) shows of a job beyond its batch object: its
progress, ETA and age as a person reads them, and its first errors with their lines.

Plain functions over the job object (job_view.job_object), so the console, the CLI and
the tests agree on one arithmetic.
"""

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from quotaflow.models import JobStatus, Result

FIRST_ERRORS = 20


@dataclass(frozen=True)
class Progress:
    done: int  # answered: completed or failed
    total: int
    percent: float
    rate_per_s: float | None  # answered per second since the job started running
    eta_s: float | None  # None: ended, or nothing answered yet to measure a rate by
    age_s: float

    @property
    def final(self) -> bool:
        return self.eta_s is None and self.rate_per_s is None


def progress(job: dict[str, Any], now: float) -> Progress:
    """Done/total, the rate since the job started running, and the time left at it."""
    counts = job["request_counts"]
    total = int(counts["total"])
    done = int(counts["completed"]) + int(counts["failed"])
    ended = job["status"] in JobStatus.FINAL
    if ended:  # cancelled and expired lines are not coming: the bar is full
        done_for_bar = total
    else:
        done_for_bar = done + int(counts.get("cancelled", 0)) + int(counts.get("expired", 0))
    percent = 100.0 * done_for_bar / total if total else (100.0 if ended else 0.0)
    age = max(0.0, now - float(job["created_at"] or now))
    started = job.get("in_progress_at") or job["created_at"]
    running_s = max(0.0, now - float(started or now))
    if ended or not done or running_s <= 0:
        rate = None if ended else (done / running_s if running_s > 0 and done else None)
        return Progress(done, total, percent, rate, None, age)
    rate = done / running_s
    left = max(0, int(counts["pending"]))
    return Progress(done, total, percent, rate, left / rate, age)


def duration_text(seconds: float | None) -> str:
    """Seconds as a person reads them: 45 s, 3 min 20 s, 2 h 5 min, 3 d 4 h."""
    if seconds is None:
        return "-"
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def first_errors(session: Session, job_id: str, limit: int = FIRST_ERRORS) -> list[dict[str, Any]]:
    """The job's first failed lines, in input order: line number, custom_id, code, message."""
    rows = session.execute(select(Result.line_no, Result.custom_id, Result.error)
                           .where(Result.job_id == job_id, Result.error.is_not(None))
                           .order_by(Result.line_no).limit(limit))
    return [{"line": line_no, "custom_id": custom_id,
             "code": (error or {}).get("code"), "message": (error or {}).get("message")}
            for line_no, custom_id, error in rows]
