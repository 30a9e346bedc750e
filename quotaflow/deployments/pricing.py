"""What a deployment's tokens cost, from the prices its deployments file gives it.

Prices are per million tokens, as providers list them. A deployment without prices
costs nothing that quotaflow can tell: its usage is counted, its cost is unknown
(None), and an estimate says so rather than calling it free.

Costs are computed when results are stored (quotaflow/tenants/spend.py keeps them), at the
prices of that moment: changing a price later does not rewrite what was spent.
"""

from collections.abc import Iterable
from dataclasses import dataclass

PER_TOKENS = 1_000_000


@dataclass(frozen=True, slots=True)
class Prices:
    """A deployment's prices per million tokens, in `currency`."""

    input_per_mtok: float
    output_per_mtok: float
    # Prompt tokens the provider served from its cache (OpenAI's
    # usage.prompt_tokens_details.cached_tokens); None: billed as any input.
    cached_input_per_mtok: float | None = None
    currency: str = "USD"

    def cost(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> float:
        """What one call's usage costs; cached tokens are part of prompt_tokens."""
        cached = min(cached_tokens, prompt_tokens) if self.cached_input_per_mtok is not None else 0
        return ((prompt_tokens - cached) * self.input_per_mtok
                + cached * (self.cached_input_per_mtok or 0.0)
                + completion_tokens * self.output_per_mtok) / PER_TOKENS


@dataclass(frozen=True, slots=True)
class CostRange:
    """What a set of requests may cost: prompt tokens at the input price plus none of
    (`low`) or all of (`high`) their max completion tokens at the output price."""

    low: float
    high: float
    currency: str

    def __add__(self, other: "CostRange") -> "CostRange":
        return CostRange(self.low + other.low, self.high + other.high, self.currency)


def cost_range(prices: Iterable[Prices | None], prompt_tokens: int,
               max_completion_tokens: int) -> CostRange | None:
    """The range over the deployments a route may send to (the cheapest one's prompt cost
    to the dearest one's full cost); None when one of them has no prices."""
    known = list(prices)
    if not known or any(p is None for p in known):
        return None
    priced = [p for p in known if p is not None]
    low = min(p.input_per_mtok for p in priced) * prompt_tokens / PER_TOKENS
    high = max(p.cost(prompt_tokens, max_completion_tokens) for p in priced)
    return CostRange(low, high, priced[0].currency)


def money(amount: float | None, currency: str) -> str:
    """An amount as people read it: two decimals, or four below one cent."""
    if amount is None:
        return "unknown (no prices)"
    places = 2 if amount == 0 or abs(amount) >= 0.01 else 4
    return f"{amount:,.{places}f} {currency}"
