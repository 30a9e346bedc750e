"""The console's progress, ETA and durations (quotaflow/observe/console_data.py)."""

from quotaflow.observe.console_data import duration_text, progress


def job(status: str, completed: int, failed: int, pending: int, total: int = 100,
        cancelled: int = 0) -> dict:
    return {"status": status, "created_at": 1000, "in_progress_at": 1010,
            "request_counts": {"total": total, "completed": completed, "failed": failed,
                               "pending": pending, "cancelled": cancelled, "expired": 0}}


def test_the_eta_is_what_is_left_at_the_rate_since_the_job_ran() -> None:
    # 40 answered in 20 s since it started running: 2 a second, 60 left: 30 s
    shown = progress(job("in_progress", 30, 10, 60), now=1030)
    assert (shown.done, shown.percent, shown.rate_per_s, shown.eta_s) == (40, 40.0, 2.0, 30.0)
    assert shown.age_s == 30


def test_nothing_answered_yet_has_no_eta() -> None:
    shown = progress(job("in_progress", 0, 0, 100), now=1030)
    assert shown.eta_s is None and shown.percent == 0


def test_an_ended_job_has_a_full_bar_and_no_eta() -> None:
    shown = progress(job("cancelled", 10, 2, 0, cancelled=88), now=2000)
    assert shown.percent == 100.0 and shown.eta_s is None and shown.final


def test_durations_read_as_people_say_them() -> None:
    assert [duration_text(s) for s in (None, 45, 200, 3600, 7500, 90000)] == [
        "-", "45 s", "3 min 20 s", "1 h", "2 h 5 min", "1 d 1 h"]
