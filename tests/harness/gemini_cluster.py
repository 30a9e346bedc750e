"""A strict mock serving Google's generateContent, gemini and vertex deployments naming it,
and a service account made at test time (tests/cluster/test_gemini_cluster.py).

The service account's key is generated here and its `token_uri` points at the mock, so
the workers' google-auth runs its real service-account flow (a signed JWT traded for
an access token) against the mock's /token, which checks the signature with the
same key file. Both deployments spend one `quota`: the mock enforces one set of
buckets for both paths, as Google's per-project quota would.
"""

import json
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.harness.procs import Proc, free_port, quotaflow
from tests.harness.servers import ROOT, service_env

KEY_ENV = "QF_TEST_GEMINI_KEY"
KEY = "gemini-test-key"
PROJECT = "qf-test-project"
LOCATION = "us-central1"
# The model a line names picks the kind it goes to; each deployment sets its own.
ROUTES = {"gemini": ("to-gemini", "gemini-conf"), "vertex": ("to-vertex", "vertex-conf")}


def write_service_account(path: Path, token_uri: str) -> Path:
    """A service-account key file with a fresh RSA key, its tokens from `token_uri`."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    path.write_text(json.dumps({
        "type": "service_account", "project_id": PROJECT, "private_key_id": "qf-test-key",
        "private_key": pem, "client_email": f"quotaflow@{PROJECT}.iam.gserviceaccount.com",
        "client_id": "1", "token_uri": token_uri}))
    return path


def path_of(kind: str, model: str) -> str:
    """The generateContent path the mock records for a deployment of `kind`."""
    if kind == "gemini":
        return f"/v1beta/models/{model}:generateContent"
    return (f"/v1/projects/{PROJECT}/locations/{LOCATION}/publishers/google/models/"
            f"{model}:generateContent")


def start_google_mock(tmp_path: Path, *options: str) -> tuple[Proc, str, Path]:
    """The strict mock with the Gemini key and a service account; its URL and key file."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    account = write_service_account(tmp_path / "service-account.json", f"{url}/token")
    proc = Proc("google-mock", quotaflow("mock-provider", "--port", str(port),
                                         "--api-key-env", KEY_ENV, *options),
                service_env(PYTHONPATH=str(ROOT), QUOTAFLOW_MOCK_GOOGLE_SERVICE_ACCOUNT=str(
                    account), **{KEY_ENV: KEY}), tmp_path)
    proc.wait_http(f"{url}/healthz")
    return proc, url, account


def deployments_toml(url: str, account: Path, rpm: int, tpm: int,
                     burst_seconds: float = 60) -> str:
    """A gemini and a vertex deployment at the mock, sharing one quota."""
    return (f'[deployments.gemini]\nprovider = "gemini"\nbase_url = "{url}/v1beta"\n'
            f'model = "gemini-conf"\napi_key_env = "{KEY_ENV}"\nrpm = {rpm}\ntpm = {tpm}\n'
            f'burst_seconds = {burst_seconds:g}\nquota = "google"\n'
            f'[deployments.vertex]\nprovider = "vertex"\nbase_url = "{url}/v1"\n'
            f'model = "vertex-conf"\nproject = "{PROJECT}"\nlocation = "{LOCATION}"\n'
            f'credentials_file = "{account}"\nrpm = {rpm}\ntpm = {tpm}\n'
            f'burst_seconds = {burst_seconds:g}\nquota = "google"\n'
            '[routes]\n"to-gemini" = "gemini"\n"to-vertex" = "vertex"\n')


def worker_env(pg_url: str, redis_url: str, deployments: Path) -> dict[str, str]:
    return service_env(PYTHONPATH=str(ROOT), QUOTAFLOW_DATABASE_URL=pg_url,
                       QUOTAFLOW_BROKER_URL=redis_url,
                       QUOTAFLOW_DEPLOYMENTS_FILE=str(deployments), **{KEY_ENV: KEY})


def expected() -> dict[str, dict[str, Any]]:
    """The generateContent body each conformance entry must be sent as, or {"error": FIELD}
    (conformance/gemini/expected.jsonl, by entry name; the same for both kinds)."""
    path = Path(__file__).parent / "conformance" / "gemini" / "expected.jsonl"
    entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {entry["name"]: entry["gemini"] for entry in entries}
