"""One way from settings to a servable app, for the CLI and for uvicorn's factory alike.

The CLI hands uvicorn the app object it builds here; tests that start the
provider as a bare `uvicorn mock_provider:app_from_env --factory` get the same
app from the same settings, read from QUOTAFLOW_MOCK_* variables instead.
"""

from fastapi import FastAPI

from mock_provider.faults import Faults
from mock_provider.lean import LeanProvider
from mock_provider.settings import ENV_PREFIX, MockProviderSettings, aws_key
from mock_provider.strict import create_app
from quotaflow.errors import ConfigError


def build_app(settings: MockProviderSettings) -> FastAPI | LeanProvider:
    """The strict judge, or the lean unlimited server when `settings.unlimited`."""
    if settings.unlimited:
        return LeanProvider(latency_ms=settings.latency_ms, api_key=settings.api_key())
    rpm, tpm = settings.rpm, settings.tpm
    if rpm is None or tpm is None:
        missing = "RPM" if rpm is None else "TPM"
        raise ConfigError(f"{ENV_PREFIX}{missing} is not set; the mock provider needs it")
    try:
        faults = Faults.from_fractions(settings.fault_fractions(),
                                       retry_after_s=settings.fault_retry_after_s)
    except ValueError as exc:
        raise ConfigError(f"mock provider: {exc}") from exc
    return create_app(
        rpm=rpm,
        tpm=tpm,
        latency_ms=settings.latency_ms,
        burst_seconds=settings.burst_seconds,
        default_max_tokens=settings.default_max_tokens,
        api_key=settings.api_key(),
        reconcile=settings.reconcile,
        faults=faults,
        itpm=settings.itpm,
        otpm=settings.otpm,
        batch_seconds=settings.batch_seconds,
        record=settings.record,
        latency_jitter_ms=settings.latency_jitter_ms,
        google_service_account=settings.google_service_account,
        aws_key=aws_key(settings),
        azure_api_version=settings.azure_api_version,
    )


def app_from_env() -> FastAPI | LeanProvider:
    """uvicorn factory: the app configured from QUOTAFLOW_MOCK_* variables alone."""
    return build_app(MockProviderSettings.load())
