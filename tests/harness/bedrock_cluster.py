"""Bedrock deployments against the strict mock's Bedrock routes, in real processes.

The mock checks every request's SigV4 signature against the test's known secret
(QUOTAFLOW_MOCK_AWS_SECRET_ENV names the variable holding it), so the workers sign with
the same key through AWS's credential chain, from the environment only: the machine's
AWS files, container and instance roles are kept out of the test.
"""

from pathlib import Path

from tests.harness.procs import Proc, free_port, quotaflow
from tests.harness.servers import service_env

ACCESS_KEY_ID = "AKIDQUOTAFLOWTEST"
SECRET = "quotaflow-test-secret/key+one"
SECRET_ENV = "QF_TEST_AWS_SECRET"
REGION = "eu-central-1"
# A model id with a version's ':' (percent-encoded in the path, signed encoded twice).
MODEL = "anthropic.claude-conformance-v1:0"


def aws_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A child's environment with the test's AWS credentials and nothing else of AWS's."""
    env = {k: v for k, v in service_env(**extra).items() if not k.startswith("AWS_")}
    return {**env, "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials"),
            "AWS_EC2_METADATA_DISABLED": "true"}


def start_mock(tmp_path: Path, *options: str) -> tuple[Proc, str]:
    """The strict mock checking signatures for the test's key; its base URL."""
    port = free_port()
    env = service_env(QUOTAFLOW_MOCK_AWS_ACCESS_KEY_ID=ACCESS_KEY_ID,
                      QUOTAFLOW_MOCK_AWS_SECRET_ENV=SECRET_ENV,
                      QUOTAFLOW_MOCK_AWS_REGION=REGION, **{SECRET_ENV: SECRET})
    proc = Proc("bedrock-mock", quotaflow("mock-provider", "--port", str(port), *options),
                env, tmp_path)
    url = f"http://127.0.0.1:{port}"
    try:
        proc.wait_http(f"{url}/healthz")
    except BaseException:
        proc.stop()
        raise
    return proc, url


def deployment(name: str, url: str, api: str = "converse", rpm: int = 600_000,
               tpm: int = 100_000_000, extra: str = "") -> str:
    """One bedrock deployment's table, at the mock."""
    return (f'[deployments.{name}]\nprovider = "bedrock"\nbase_url = "{url}"\n'
            f'region = "{REGION}"\nmodel = "{MODEL}"\nbedrock_api = "{api}"\n'
            f"rpm = {rpm}\ntpm = {tpm}\n{extra}")
