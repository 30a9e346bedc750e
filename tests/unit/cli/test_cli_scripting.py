"""The CLI where no one watches it (issue 30, part 2): plain progress lines without a
terminal, nothing with --quiet, and exit statuses a script can branch on."""

import io

import pytest
from click.testing import CliRunner

from cli import exit_codes
from cli.main import cli
from cli.progress import LineProgress, NoProgress, request_progress
from quotaflow.config import get_settings
from quotaflow.errors import (
    AuthenticationError,
    ConfigError,
    InputFileError,
    JobNotFound,
    ServiceUnavailable,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_without_a_terminal_progress_is_a_plain_line_every_interval() -> None:
    out, clock = io.StringIO(), Clock()
    with LineProgress(out, interval_s=5.0, clock=clock) as progress:
        task = progress.add_task("job_1", total=2000)
        for _ in range(40):  # 2.5 s at 16 req/s: no line yet
            clock.now += 0.0625
            progress.advance(task)
        assert out.getvalue() == ""
        for _ in range(40):  # 5 s in: the first line
            clock.now += 0.0625
            progress.advance(task)
        progress.update(task, completed=1000, description="job_1 running")
    lines = out.getvalue().splitlines()
    # One line at 5 s; one at the end (the context's exit), never a redrawn bar's pieces.
    assert len(lines) == 2
    assert lines[0] == "job_1: 80/2,000 (4.0%), 16.0 req/s, eta 2:00"
    assert lines[-1] == "job_1 running: 1,000/2,000 (50.0%), 200.0 req/s, eta 0:05"
    assert all("\r" not in line and "\x1b" not in line for line in lines)


def test_a_finished_task_says_how_long_it_took() -> None:
    out, clock = io.StringIO(), Clock()
    with LineProgress(out, interval_s=5.0, clock=clock) as progress:
        task = progress.add_task("job_2", total=3)
        clock.now += 3725
        progress.update(task, completed=3)
    assert out.getvalue() == "job_2: 3/3 (100.0%), 0.0 req/s, done in 1:02:05\n"


def test_quiet_progress_writes_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    with request_progress(quiet=True) as progress:
        assert isinstance(progress, NoProgress)
        task = progress.add_task("job", total=1)
        progress.advance(task)
    assert capsys.readouterr().err == ""


def test_a_pipe_gets_plain_lines_at_the_configured_interval(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # pytest's captured stderr is no terminal, as in CI or behind `| tee`
    monkeypatch.setenv("QUOTAFLOW_PROGRESS_INTERVAL_S", "0.5")
    get_settings.cache_clear()
    try:
        progress = request_progress()
        assert isinstance(progress, LineProgress) and progress._interval == 0.5
    finally:
        get_settings.cache_clear()


@pytest.mark.parametrize(("error", "code"), [
    (InputFileError("the file is empty"), exit_codes.INVALID_INPUT),
    (ServiceUnavailable("cannot reach the quotaflow API"), exit_codes.UNREACHABLE),
    (ConfigError("QUOTAFLOW_BROKER_URL is not set"), exit_codes.CONFIG),
    (JobNotFound("no job batch_x"), exit_codes.ERROR),
    (AuthenticationError("no key"), exit_codes.ERROR),
])
def test_each_kind_of_error_has_its_exit_status(error: Exception, code: int) -> None:
    assert exit_codes.for_error(error) == code


def test_the_four_statuses_a_script_tells_apart_are_distinct() -> None:
    codes = {exit_codes.OK, exit_codes.INVALID_INPUT, exit_codes.FAILED_LINES,
             exit_codes.UNREACHABLE, exit_codes.CONFIG, exit_codes.ERROR}
    assert len(codes) == 6


@pytest.mark.parametrize(("status", "failed", "code"), [
    ("completed", 0, exit_codes.OK), ("completed", 2, exit_codes.FAILED_LINES),
    ("failed", 0, exit_codes.FAILED_LINES), ("cancelled", 0, exit_codes.FAILED_LINES),
    ("expired", 0, exit_codes.FAILED_LINES)])
def test_an_ended_job_exits_zero_only_when_every_line_succeeded(
        status: str, failed: int, code: int) -> None:
    job = {"status": status, "request_counts": {"total": 5, "failed": failed}}
    assert exit_codes.for_job(job) == code


def test_run_json_needs_an_output_file(tmp_path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text("{}\n")
    result = CliRunner().invoke(cli, ["run", str(path), "--json"])
    assert result.exit_code == exit_codes.INVALID_INPUT
    assert "--json prints the job object on standard output: give -o FILE" in result.output


@pytest.mark.parametrize("command", ["run", "submit", "status", "estimate"])
def test_the_commands_scripts_use_take_quiet(command: str) -> None:
    help_text = CliRunner().invoke(cli, [command, "--help"]).output
    assert "--quiet" in help_text


@pytest.mark.parametrize("command", ["run", "submit", "status", "estimate", "cancel", "retry",
                                     "delete", "jobs", "limits"])
def test_the_commands_scripts_use_take_json(command: str) -> None:
    assert "--json" in CliRunner().invoke(cli, [command, "--help"]).output
