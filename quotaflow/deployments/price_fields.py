"""The price keys of a `[deployments.NAME]` table, and the checks between them.

A deployment's prices are flat keys (`input_per_mtok`, `cache_write_per_mtok`, ...);
its long-context tier is one inline table of the same keys plus its threshold,
`long_context = { above_tokens = 200000, input_per_mtok = 2.5, output_per_mtok = 15 }`.
A tier must price what the base prices (a cache price set on one and not the other
would bill those tokens at the plain input price in one tier only: refused, not
guessed).
"""

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from quotaflow.deployments.pricing import Prices

OPTIONAL_PRICES = ("cached_input_per_mtok", "cache_write_per_mtok", "cache_write_1h_per_mtok")


class LongContextPrices(BaseModel):
    """The prices of a request whose prompt has more than `above_tokens` tokens."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    above_tokens: int = Field(
        gt=0, description="The threshold: a request whose prompt (cache reads and writes "
        "included) has more tokens than this is priced at this tier, all of its tokens.")
    input_per_mtok: float = Field(ge=0, description="The tier's price per million prompt "
                                  "tokens.")
    output_per_mtok: float = Field(ge=0, description="The tier's price per million "
                                   "completion tokens.")
    cached_input_per_mtok: float | None = Field(
        default=None, ge=0, description="The tier's cache-read price.")
    cache_write_per_mtok: float | None = Field(
        default=None, ge=0, description="The tier's cache-write price.")
    cache_write_1h_per_mtok: float | None = Field(
        default=None, ge=0, description="The tier's 1-hour cache-write price.")


def check_prices(table: Any) -> None:
    """Raise ValueError naming what is wrong with a Deployment's price keys."""
    if (table.input_per_mtok is None) != (table.output_per_mtok is None):
        raise ValueError("set both input_per_mtok and output_per_mtok, or neither")
    if table.input_per_mtok is None:
        extra = [name for name in (*OPTIONAL_PRICES, "long_context")
                 if getattr(table, name) is not None]
        if extra:
            raise ValueError(f"{extra[0]} needs input_per_mtok and output_per_mtok")
        return
    if table.cache_write_1h_per_mtok is not None and table.cache_write_per_mtok is None:
        raise ValueError("cache_write_1h_per_mtok needs cache_write_per_mtok (the 5-minute "
                         "writes' price)")
    tier = table.long_context
    if tier is None:
        return
    for name in OPTIONAL_PRICES:
        if (getattr(table, name) is None) != (getattr(tier, name) is None):
            where = "long_context" if getattr(tier, name) is None else "the deployment"
            raise ValueError(f"long_context: set {name} on both the deployment and its "
                             f"long_context tier, or on neither (missing on {where})")


def prices_of(table: Any, currency: str) -> Prices:
    """The Prices of a priced Deployment (check_prices passed)."""
    tier = table.long_context
    return Prices(
        table.input_per_mtok, table.output_per_mtok, table.cached_input_per_mtok, currency,
        table.cache_write_per_mtok, table.cache_write_1h_per_mtok,
        None if tier is None else Prices(
            tier.input_per_mtok, tier.output_per_mtok, tier.cached_input_per_mtok, currency,
            tier.cache_write_per_mtok, tier.cache_write_1h_per_mtok),
        0 if tier is None else tier.above_tokens)
