"""The mock provider's settings: one object, whether they come from click or the environment.

`quotaflow mock-provider` builds it from its options; `uvicorn
mock_provider:app_from_env --factory` (the tests' way in) reads it from
QUOTAFLOW_MOCK_* variables. Either way the app is built from the same typed
object, so the two ways cannot drift apart, and the CLI no longer has to pass
its options through the process environment. The values are only parsed here;
the servers check their ranges, so that a test constructing them directly meets
the same errors.
"""

import os
from typing import Any

from pydantic import Field, ValidationError
from pydantic_core import ErrorDetails
from pydantic_settings import BaseSettings, SettingsConfigDict

from quotaflow.errors import ConfigError

ENV_PREFIX = "QUOTAFLOW_MOCK_"
_KINDS = {"int_parsing": "a whole number", "int_from_float": "a whole number",
          "float_parsing": "a number", "bool_parsing": "true or false (1 or 0)"}


class MockProviderSettings(BaseSettings):
    """Every knob of the mock provider; each reads QUOTAFLOW_MOCK_<NAME> when not given."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_ignore_empty=True,
                                      str_strip_whitespace=True, extra="forbid")

    # The lean server of the throughput benchmarks: admits everything, so the limits,
    # burst, reconcile and faults below do not apply.
    unlimited: bool = False
    # Required by the strict server; None only so that the unlimited one needs neither.
    rpm: int | None = None
    tpm: int | None = None
    # /v1/messages' input and output tokens per minute (Anthropic's ITPM and OTPM);
    # unset: each is tpm.
    itpm: int | None = None
    otpm: int | None = None
    latency_ms: float = 0.0
    # Each answer waits a further 0..this many ms at random, so answers come back in
    # another order than the requests came (the strict server only).
    latency_jitter_ms: float = Field(default=0.0, ge=0)
    burst_seconds: float = 60.0
    # Counted at admission when a request sets no max_tokens.
    default_max_tokens: int = 256
    # The variable holding the key clients must send; None: no key asked.
    api_key_env: str | None = None
    # Bill real usage after each answer, refunding the unused part of max_tokens.
    reconcile: bool = True
    # How long a Message Batch (/v1/messages/batches) stays in_progress before it ends.
    batch_seconds: float = 1.0
    # The api-version Azure OpenAI's deployment-name paths must carry (azure.py).
    azure_api_version: str = "2024-10-21"
    # Test-only: append every model request's body to this JSONL file (record.py).
    record: str | None = None
    # Vertex AI: the service-account key file whose tokens the /token endpoint issues
    # (its token_uri points at this server); unset: no Vertex AI token is ever valid.
    google_service_account: str | None = None
    # Bedrock's routes (bedrock.py): the access key id signatures must name, the variable
    # holding its secret (unset: signatures are not checked) and the region they are for.
    aws_access_key_id: str = "AKIDQUOTAFLOWMOCK"
    aws_secret_env: str | None = None
    aws_region: str = "us-east-1"
    # Fractions of requests that meet each fault (mock_provider.faults).
    fault_429: float = 0.0
    fault_500: float = 0.0
    fault_529: float = 0.0
    fault_reset: float = 0.0
    fault_hang: float = 0.0
    fault_malformed: float = 0.0
    # The retry-after of the simulated 429 storm (fault 429), in seconds.
    fault_retry_after_s: float = Field(default=1.0, gt=0)

    @classmethod
    def load(cls, **given: Any) -> "MockProviderSettings":
        """The settings from `given`, the rest from QUOTAFLOW_MOCK_* or the defaults; a bad
        value is a ConfigError naming its variable."""
        try:
            return cls(**given)
        except ValidationError as exc:
            raise ConfigError("\n".join(_explain(error) for error in exc.errors())) from None

    def fault_fractions(self) -> dict[str, float]:
        """By the names `--fault`, /stats and PUT /faults use."""
        return {"429": self.fault_429, "500": self.fault_500, "529": self.fault_529,
                "reset": self.fault_reset,
                "hang": self.fault_hang, "malformed": self.fault_malformed}

    def api_key(self) -> str | None:
        """The key from the variable api_key_env names, read now; None: no auth."""
        if not self.api_key_env:
            return None
        key = os.environ.get(self.api_key_env)
        if not key:
            raise ConfigError(f"the mock provider's key is read from {self.api_key_env} "
                              f"(--api-key-env, {ENV_PREFIX}API_KEY_ENV), which is empty or "
                              "not set")
        return key


def aws_key(settings: MockProviderSettings) -> Any:
    """The AWS key Bedrock's routes check signatures with (bedrock_checks.AwsKey), read
    now from the variable aws_secret_env names; None where that is unset."""
    from mock_provider.bedrock_checks import AwsKey

    if not settings.aws_secret_env:
        return None
    secret = os.environ.get(settings.aws_secret_env)
    if not secret:
        raise ConfigError(f"the mock provider's AWS secret is read from "
                          f"{settings.aws_secret_env} ({ENV_PREFIX}AWS_SECRET_ENV), which is "
                          "empty or not set")
    return AwsKey(settings.aws_access_key_id, secret, settings.aws_region)


def _explain(error: ErrorDetails) -> str:
    """One pydantic error as a sentence about the variable that caused it."""
    field = str(error["loc"][0]) if error["loc"] else ""
    name = f"{ENV_PREFIX}{field.upper()}"
    kind = _KINDS.get(error["type"])
    if kind is not None:
        return f"{name} must be {kind}, got {error['input']!r}"
    return f"mock provider: {name}: {error['msg']}"
