"""Prices and costs, without a server: a price list's cost and the range over several, and
a deployment's prices (both or neither, one currency); the spend limit on the real
PostgreSQL and a real mock provider is tests/cluster/test_spend.py."""

from pathlib import Path

import pytest

from quotaflow.config import Settings
from quotaflow.deployments.deployment import Deployment
from quotaflow.deployments.pricing import Prices, cost_range, money, tally_of
from quotaflow.errors import ConfigError


def test_prices_cost_and_ranges() -> None:
    prices = Prices(0.15, 0.60, cached_input_per_mtok=0.075)
    assert prices.cost(1_000_000, 1_000_000) == pytest.approx(0.75)
    # Cached prompt tokens are part of the prompt, billed at their own price.
    assert prices.cost(1_000_000, 0, cached_tokens=400_000) == pytest.approx(0.09 + 0.03)
    dear = Prices(1.0, 4.0)
    span = cost_range([prices, dear], tally_of(1_000_000, 1_000_000))
    assert (span.low, span.high) == (pytest.approx(0.15), pytest.approx(5.0))
    assert cost_range([prices, None], tally_of(10, 10)) is None  # one unpriced: unknown, not free
    assert money(1234.5, "USD") == "1,234.50 USD" and money(0.0012, "EUR") == "0.0012 EUR"


def test_deployment_prices_are_both_or_neither_and_in_one_currency(tmp_path: Path) -> None:
    base = dict(name="d", provider="mock", model="m", rpm=60, tpm=1000)
    assert Deployment(**base).prices is None
    with pytest.raises(ValueError, match="both input_per_mtok and output_per_mtok"):
        Deployment(**base, input_per_mtok=1.0)
    (tmp_path / "d.toml").write_text(
        '[deployments.a]\nprovider = "mock"\nmodel = "a"\nrpm = 60\ntpm = 1000\n'
        'input_per_mtok = 1\noutput_per_mtok = 2\n'
        '[deployments.b]\nprovider = "mock"\nmodel = "b"\nrpm = 60\ntpm = 1000\n'
        'input_per_mtok = 1\noutput_per_mtok = 2\ncurrency = "EUR"\n')
    with pytest.raises(ConfigError, match="several currencies"):
        Settings(deployments_file=tmp_path / "d.toml").load_deployments()
