"""What a deployment's tokens cost, from the prices its deployments file gives it.

Prices are per million tokens, as providers list them: input, output, cache reads
(OpenAI's cached_tokens, Anthropic's cache_read_input_tokens, Gemini's cached content),
cache writes (Anthropic's cache_creation_input_tokens, at their own price for the
5-minute and the 1-hour lifetimes) and a long-context tier: a whole request priced at
other rates once its prompt is over a threshold (Gemini's and Claude's >200k-token
prices). A deployment without prices costs nothing that quotaflow can tell: its usage
is counted, its cost is unknown (None), and an estimate says so rather than calling
it free.

Costs are computed when results are stored (quotaflow/tenants/spend.py keeps them), at the
prices of that moment: changing a price later does not rewrite what was spent.
"""

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

PER_TOKENS = 1_000_000


@dataclass(frozen=True, slots=True)
class Prices:
    """A deployment's prices per million tokens, in `currency`. An unset cache price
    bills those tokens as any input, as a provider without that price does."""

    input_per_mtok: float
    output_per_mtok: float
    # Prompt tokens read from the provider's cache.
    cached_input_per_mtok: float | None = None
    currency: str = "USD"
    # Prompt tokens written to the cache (Anthropic's 5-minute writes), and the part of
    # them written for an hour (unset: at cache_write_per_mtok).
    cache_write_per_mtok: float | None = None
    cache_write_1h_per_mtok: float | None = None
    # The prices of a request whose prompt has more than long_context_above tokens.
    long_context: "Prices | None" = None
    long_context_above: int = 0

    def cost(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0,
             cache_write_tokens: int = 0, cache_write_1h_tokens: int = 0) -> float:
        """What one call's usage costs. Cache reads and writes are part of prompt_tokens
        (as quotaflow counts them for every provider); the 1-hour writes are part of the
        writes. Runs for every stored answer: arithmetic on floats only."""
        if self.long_context is not None and prompt_tokens > self.long_context_above:
            return self.long_context.cost(prompt_tokens, completion_tokens, cached_tokens,
                                          cache_write_tokens, cache_write_1h_tokens)
        base = self.input_per_mtok
        total = prompt_tokens * base + completion_tokens * self.output_per_mtok
        if cached_tokens and self.cached_input_per_mtok is not None:
            total += min(cached_tokens, prompt_tokens) * (self.cached_input_per_mtok - base)
        if cache_write_tokens and self.cache_write_per_mtok is not None:
            hour = min(cache_write_1h_tokens, cache_write_tokens)
            total += (cache_write_tokens - hour) * (self.cache_write_per_mtok - base)
            if hour:
                total += hour * ((self.cache_write_1h_per_mtok or self.cache_write_per_mtok)
                                 - base)
        return total / PER_TOKENS

    @property
    def dearest_input_per_mtok(self) -> float:
        """The most a prompt token can cost outside the long-context tier: input, or a
        cache write where that is dearer."""
        return max(self.input_per_mtok, self.cache_write_per_mtok or 0.0,
                   self.cache_write_1h_per_mtok or 0.0)

    @property
    def writes_priced(self) -> bool:
        """Whether a request asking for cache writes may cost more than its input price."""
        tier = self.long_context
        return (self.dearest_input_per_mtok > self.input_per_mtok
                or (tier is not None and tier.writes_priced))


class Tallied(Protocol):
    """Requests' tokens as a cost estimate needs them (TokenTally, ingest's RouteTally)."""

    prompt_tokens: int
    max_completion_tokens: int
    cache_write_tokens: int
    above: "dict[int, TokenTally]"


@dataclass(slots=True)
class TokenTally:
    """Requests' prompt tokens, completion ceilings and the prompt tokens of those asking
    for cache writes; `above` the same of the requests whose prompt is over each
    long-context threshold a tally was told of (a request's tier is its own, so a total
    alone cannot say which prices it pays)."""

    prompt_tokens: int = 0
    max_completion_tokens: int = 0
    cache_write_tokens: int = 0
    above: "dict[int, TokenTally]" = field(default_factory=dict)

    def add(self, prompt: int, completion: int, writes: bool,
            thresholds: tuple[int, ...] = ()) -> None:
        self.prompt_tokens += prompt
        self.max_completion_tokens += completion
        if writes:
            self.cache_write_tokens += prompt
        if thresholds:
            count_above(self.above, thresholds, prompt, completion, writes)


def count_above(above: dict[int, TokenTally], thresholds: tuple[int, ...], prompt: int,
                completion: int, writes: bool) -> None:
    """Tally one request in `above` under each threshold its prompt is over."""
    for threshold in thresholds:
        if prompt > threshold:
            part = above.get(threshold)
            if part is None:
                part = above[threshold] = TokenTally()
            part.add(prompt, completion, writes)


@dataclass(frozen=True, slots=True)
class CostRange:
    """What a set of requests may cost: prompt tokens at the input price plus none of
    (`low`) or all of (`high`, with every requested cache write at its price) their max
    completion tokens at the output price, each request in its long-context tier."""

    low: float
    high: float
    currency: str

    def __add__(self, other: "CostRange") -> "CostRange":
        return CostRange(self.low + other.low, self.high + other.high, self.currency)


def _bounds(prices: Prices, tally: Tallied) -> tuple[float, float]:
    """(low, high) of the tallied requests at one deployment's prices."""
    prompt, completion, writes = (tally.prompt_tokens, tally.max_completion_tokens,
                                  tally.cache_write_tokens)
    low = high = 0.0
    tier = prices.long_context
    if tier is not None:
        part = tally.above.get(prices.long_context_above)
        if part is not None:
            low += part.prompt_tokens * tier.input_per_mtok
            high += _high(tier, part.prompt_tokens, part.max_completion_tokens,
                          part.cache_write_tokens)
            prompt -= part.prompt_tokens
            completion -= part.max_completion_tokens
            writes -= part.cache_write_tokens
    low += prompt * prices.input_per_mtok
    high += _high(prices, prompt, completion, writes)
    return low / PER_TOKENS, high / PER_TOKENS


def _high(prices: Prices, prompt: int, completion: int, writes: int) -> float:
    return ((prompt - writes) * prices.input_per_mtok + writes * prices.dearest_input_per_mtok
            + completion * prices.output_per_mtok)


def cost_range(prices: Iterable[Prices | None], tally: Tallied) -> CostRange | None:
    """The range over the deployments a route may send to (the cheapest one's prompt cost
    to the dearest one's full cost); None when one of them has no prices."""
    known = list(prices)
    if not known or any(p is None for p in known):
        return None
    bounds = [_bounds(p, tally) for p in known if p is not None]
    return CostRange(min(low for low, _ in bounds), max(high for _, high in bounds),
                     next(p.currency for p in known if p is not None))


def tally_of(prompt_tokens: int, max_completion_tokens: int) -> TokenTally:
    """A tally of requests asking for no cache writes and under every threshold."""
    return TokenTally(prompt_tokens, max_completion_tokens)


def money(amount: float | None, currency: str) -> str:
    """An amount as people read it: two decimals, or four below one cent."""
    if amount is None:
        return "unknown (no prices)"
    places = 2 if amount == 0 or abs(amount) >= 0.01 else 4
    return f"{amount:,.{places}f} {currency}"
