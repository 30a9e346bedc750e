"""`quotaflow estimate FILE` with no API configured (issue 30, part 3): counted here from
the deployments file, as `quotaflow run` would run it, with the tenant's limits "not
checked". The API's answer for the same file is compared in
tests/cluster/test_estimate_cluster.py."""

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli import exit_codes
from cli.estimate import api_configured
from cli.main import cli
from quotaflow.config import get_settings
from tests.harness.factories import chat_line, write_jsonl

DEPLOYMENTS = '''
[deployments.priced]
provider = "openai"
base_url = "http://127.0.0.1:9/v1"
model = "gpt-4o-mini"
api_key_env = "QF_OFFLINE_TEST_KEY"
rpm = 60
tpm = 1000000
input_per_mtok = 0.15
output_per_mtok = 0.60
[routes]
"*" = "priced"
'''


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Settings with a deployments file and no QUOTAFLOW_API_URL (nor a .env naming one)."""
    path = tmp_path / "deployments.toml"
    path.write_text(DEPLOYMENTS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("QUOTAFLOW_API_URL", raising=False)
    monkeypatch.setenv("QUOTAFLOW_DEPLOYMENTS_FILE", str(path))
    get_settings.cache_clear()
    yield tmp_path
    get_settings.cache_clear()


def test_without_an_api_the_estimate_is_counted_from_the_deployments_file(
        offline: Path) -> None:
    write_jsonl(offline / "in.jsonl", [chat_line(f"q{i}", prompt="x" * 40) for i in range(120)]
                + ["not json"])
    assert not api_configured(get_settings())
    result = CliRunner().invoke(cli, ["estimate", "in.jsonl", "--json"])
    assert result.exit_code == exit_codes.OK, result.output
    found = json.loads(result.output)
    assert found["lines"]["total"] == 121 and found["lines"]["valid"] == 120
    assert found["lines"]["errors"][0]["line"] == 121
    [route] = found["routes"]
    assert route["deployments"] == ["priced"] and route["tokenizer"] == "o200k_base"
    # 120 requests at 60 RPM from a full bucket (60 at once, less the standard floor's 5%)
    assert route["time"]["binding"] == "rpm" and 60 < route["time"]["seconds"] < 65
    assert found["totals"]["cost"]["currency"] == "USD"
    assert found["tenant"] is None  # not checked: the limits live in the cluster
    assert found["submit_would_refuse"] == []


def test_the_summary_says_the_tenant_limits_were_not_checked(offline: Path) -> None:
    write_jsonl(offline / "in.jsonl", [chat_line("a"), chat_line("b")])
    result = CliRunner().invoke(cli, ["estimate", "in.jsonl"])
    assert result.exit_code == 0, result.output
    assert "lines     2: 2 valid, 0 invalid; queue standard" in result.output
    assert "tenant limits: not checked" in result.output


def test_a_file_submit_would_refuse_exits_two(offline: Path) -> None:
    write_jsonl(offline / "dupes.jsonl", [chat_line("x"), chat_line("x")])
    result = CliRunner().invoke(cli, ["estimate", "dupes.jsonl", "--quiet"])
    assert result.exit_code == exit_codes.INVALID_INPUT
    assert result.output == ""


def test_a_configured_api_is_asked(offline: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Nothing listens on port 9: the command went to the API, not to the file.
    monkeypatch.setenv("QUOTAFLOW_API_URL", "http://127.0.0.1:9")
    get_settings.cache_clear()
    assert api_configured(get_settings())
    write_jsonl(offline / "in.jsonl", [chat_line("a")])
    result = CliRunner().invoke(cli, ["estimate", "in.jsonl"])
    assert "cannot reach the quotaflow API at http://127.0.0.1:9" in str(result.exception)
    # --offline counts here all the same
    result = CliRunner().invoke(cli, ["estimate", "in.jsonl", "--offline", "--json"])
    assert result.exit_code == 0 and json.loads(result.output)["tenant"] is None
