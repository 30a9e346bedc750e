"""Vertex AI's credentials: a deployment's own key file, else google-auth's application
default credentials (here the GOOGLE_APPLICATION_CREDENTIALS file), else a clear error
naming the deployment; no token is fetched until a call needs one."""

from pathlib import Path

import pytest

from quotaflow.deployments.deployment import Deployment
from quotaflow.errors import ConfigError
from quotaflow.providers.google_auth import SCOPE, load_credentials
from tests.harness.gemini_cluster import write_service_account

TOKEN_URI = "http://127.0.0.1:9/token"  # never called: credentials load without a token


def vertex(**fields: object) -> Deployment:
    return Deployment(name="v", provider="vertex", model="gemini-2.5-pro", project="p1",
                      location="europe-west4", rpm=60, tpm=1000, **fields)


def test_without_a_key_file_the_application_default_credentials_are_used(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    account = write_service_account(tmp_path / "adc.json", TOKEN_URI)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(account))

    credentials = load_credentials(vertex())

    assert credentials.service_account_email.startswith("quotaflow@")
    assert tuple(credentials.scopes) == (SCOPE,)
    assert credentials.token is None  # fetched at the first call, not at load


def test_the_deployments_key_file_wins_over_the_default(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    own = write_service_account(tmp_path / "own.json", TOKEN_URI)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))

    credentials = load_credentials(vertex(credentials_file=str(own)))

    assert credentials.service_account_email.startswith("quotaflow@")


def test_no_credentials_at_all_fail_naming_the_deployment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))

    with pytest.raises(ConfigError, match="deployment 'v': no Google credentials"):
        load_credentials(vertex())
