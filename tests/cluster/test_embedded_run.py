"""`quotaflow run`: the quick start, in one process on SQLite, exactly as a user types it."""

import json
import subprocess
from pathlib import Path

import httpx

from tests.harness.factories import HOSTILE_LINES, chat_line, write_jsonl
from tests.harness.procs import Proc, free_port, quotaflow
from tests.harness.servers import ROOT, service_env


def run_cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = service_env(QUOTAFLOW_DATABASE_URL=f"sqlite:///{cwd / 'embedded.db'}")
    return subprocess.run(quotaflow(*args), cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


def test_example_file_runs_on_embedded_defaults(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "run", str(ROOT / "examples" / "prompts.jsonl"),
                     "-o", "results.jsonl")
    assert result.returncode == 0, result.stderr
    assert "SIMULATED" in result.stderr  # the mock provider says what it is
    inputs = [json.loads(line) for line in
              (ROOT / "examples" / "prompts.jsonl").read_text().splitlines()]
    lines = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [line["custom_id"] for line in lines] == [i["custom_id"] for i in inputs]
    for line, given in zip(lines, inputs, strict=True):
        prompt = given["prompt"] if "prompt" in given else given["body"]["messages"][-1]["content"]
        message = line["response"]["body"]["choices"][0]["message"]["content"]
        assert message == f"simulated reply to: {prompt}"
        assert line["response"]["body"]["system_fingerprint"] == "quotaflow-simulated"
    assert "completed: 40 succeeded, 0 failed of 40" in result.stderr
    assert not (tmp_path / "results.errors.jsonl").exists()


def test_bad_lines_are_reported_and_good_lines_still_run(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "mixed.jsonl", [chat_line("ok-1"), "not json", chat_line("ok-2"),
                                           {**chat_line("wrong-url"), "url": "/v1/images"}])
    result = run_cli(tmp_path, "run", "mixed.jsonl", "-o", "out.jsonl")
    assert result.returncode == 3, result.stderr  # some lines failed (cli/exit_codes.py)
    assert "2 succeeded, 2 failed of 4" in result.stderr
    output = (tmp_path / "out.jsonl").read_text().splitlines()
    ok = [json.loads(line)["custom_id"] for line in output]
    assert ok == ["ok-1", "ok-2"]
    errors = [json.loads(line) for line in
              (tmp_path / "out.errors.jsonl").read_text().splitlines()]
    assert [(e["custom_id"], e["error"]["line"]) for e in errors] == [(None, 2), ("wrong-url", 4)]


def test_hostile_lines_end_in_the_error_file_not_a_traceback(tmp_path: Path) -> None:
    # Given a file from Excel (a byte-order mark) with every hostile line after a good one
    hostile = [line for line, _, _ in HOSTILE_LINES.values()]
    path = write_jsonl(tmp_path / "hostile.jsonl", [chat_line("ok-1"), *hostile])
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    result = run_cli(tmp_path, "run", "hostile.jsonl", "-o", "out.jsonl")
    # Then the good line runs and each hostile line is an error line naming its reason
    assert result.returncode == 3, result.stderr  # failed lines
    assert "Traceback" not in result.stderr
    assert f"1 succeeded, {len(hostile)} failed of {len(hostile) + 1}" in result.stderr
    errors = [json.loads(line) for line in
              (tmp_path / "out.errors.jsonl").read_text().splitlines()]
    assert [e["error"]["line"] for e in errors] == list(range(2, len(hostile) + 2))
    for error, (_, reason, custom_id) in zip(errors, HOSTILE_LINES.values(), strict=True):
        assert reason in error["error"]["message"] and error["custom_id"] == custom_id


def test_rejected_file_exits_with_the_reason(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "dupes.jsonl", [chat_line("x"), chat_line("x")])
    result = run_cli(tmp_path, "run", "dupes.jsonl", "-o", "out.jsonl")
    assert result.returncode == 2  # invalid input
    assert "duplicate custom_id 'x' on lines 1 and 2" in result.stderr
    assert not (tmp_path / "out.jsonl").exists()  # nothing half-written


def test_missing_deployments_file_is_a_clear_error(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "in.jsonl", [chat_line("x")])
    env_file = tmp_path / "nowhere.toml"
    result = subprocess.run(
        quotaflow("run", "in.jsonl"), cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env=service_env(QUOTAFLOW_DATABASE_URL=f"sqlite:///{tmp_path / 'e.db'}",
                        QUOTAFLOW_DEPLOYMENTS_FILE=str(env_file)))
    assert result.returncode == 78  # a configuration error (cli/exit_codes.py)
    assert f"deployments file {env_file} does not exist" in result.stderr


def test_run_calls_a_real_openai_compatible_endpoint(tmp_path: Path) -> None:
    # Given the strict mock provider served over HTTP and a deployments file naming it
    port = free_port()
    env = service_env(QF_KEY="sk-embedded-test")
    server = Proc("provider", quotaflow("mock-provider", "--port", str(port), "--rpm", "6000",
                                        "--tpm", "1000000", "--api-key-env", "QF_KEY"),
                  env, tmp_path)
    try:
        server.wait_http(f"http://127.0.0.1:{port}/healthz")
        (tmp_path / "d.toml").write_text(
            f'[deployments.http]\nprovider = "openai"\nbase_url = "http://127.0.0.1:{port}/v1"\n'
            'model = "served-model"\napi_key_env = "QF_KEY"\nrpm = 6000\ntpm = 1000000\n'
            '[routes]\n"*" = "http"\n')
        write_jsonl(tmp_path / "in.jsonl", [chat_line(f"r{i}") for i in range(30)])
        # When the file is run in-process against it
        result = subprocess.run(
            quotaflow("run", "in.jsonl", "-o", "out.jsonl"), cwd=tmp_path, capture_output=True,
            text=True, timeout=120,
            env={**env, "QUOTAFLOW_DATABASE_URL": f"sqlite:///{tmp_path / 'e.db'}",
                 "QUOTAFLOW_DEPLOYMENTS_FILE": str(tmp_path / "d.toml")})
        stats = httpx.get(f"http://127.0.0.1:{port}/stats").json()
    finally:
        server.stop()
    # Then every request went over HTTP once, with the deployment's model
    assert result.returncode == 0, result.stderr
    assert "SIMULATED" not in result.stderr  # a deployments file was given
    lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [line["custom_id"] for line in lines] == [f"r{i}" for i in range(30)]
    assert {line["response"]["body"]["model"] for line in lines} == {"served-model"}
    assert stats["admitted"] == 30 and stats["duplicate_bodies"] == 0
