"""A deployment's limits as the limiter's buckets see them, derived once per deployment
(`Deployment.budget`): routing, admission, estimates, gauges and `quotaflow limits` all read
that one `Budget`.

Each deployment has two continuously refilling buckets, requests and tokens, with
capacity = limit x burst_seconds / 60 (quotaflow/budget/limiter.py has the rest of the
limiter's vocabulary, quotaflow/budget/buckets.py the limiters). A `Cap` (a tenant's or a
job's --rpm/--tpm) is one more pair of buckets that an admission takes from together with
the deployment's: a budget carrying caps admits only what fits them all.
"""

import enum
from dataclasses import dataclass, replace
from functools import cached_property

from quotaflow.errors import RequestTooLarge


class Refunds(enum.IntEnum):
    """Whether the provider gives back the unused part of max_tokens after a call."""

    NEVER = 0
    ALWAYS = 1
    LEARNED = 2  # from its x-ratelimit-remaining-tokens headers

    @classmethod
    def of(cls, reconcile_usage: bool | str) -> "Refunds":
        if reconcile_usage == "auto":
            return cls.LEARNED
        return cls.ALWAYS if reconcile_usage else cls.NEVER


@dataclass(frozen=True)
class Cap:
    """A tenant's or a job's RPM/TPM cap inside a deployment's budget (0: that one is not
    capped). `scope` names whose it is ("tenant:acme", "job:batch_..."): one bucket pair
    per scope and deployment budget, refilling as the deployment's do (same burst
    seconds, same refund mode). Its tokens count what the deployment's buckets count
    (input and output together, where a split budget keeps them apart)."""

    scope: str
    rpm: float = 0.0
    tpm: float = 0.0

    def capacities(self, burst_seconds: float) -> tuple[float, float]:
        """Its buckets' capacities: limit x burst_seconds / 60, and room for one request at
        least (30 RPM per second would otherwise never hold a whole one)."""
        requests = max(1.0, self.rpm * burst_seconds / 60) if self.rpm else 0.0
        return requests, self.tpm * burst_seconds / 60

    def packed(self, burst_seconds: float) -> str:
        """The cap as bucket.lua reads it after the budget: two rates and capacities."""
        requests, tokens = self.capacities(burst_seconds)
        return " ".join(repr(float(n)) for n in (self.rpm / 60, requests, self.tpm / 60, tokens))


@dataclass(frozen=True)
class Budget:
    """One deployment's limits, as the buckets see them."""

    name: str
    rpm: float
    tpm: float
    burst_seconds: float = 60.0
    # The longest a call can be in flight; an unsettled admission older than
    # this is forgotten (its worker died).
    flight_timeout_s: float = 300.0
    # Refill kept in hand at admission: a provider whose bucket is full loses the
    # refill of the time a request spends travelling to it (docs/architecture.md,
    # "The limiter").
    margin_s: float = 0.0
    refunds: Refunds = Refunds.LEARNED
    # Input tokens per minute where they have a bucket of their own (then `tpm` is the
    # output tokens'); 0: the tokens bucket holds input and output together.
    itpm: float = 0.0
    # The caps of whoever spends it (a tenant's, a job's): () for the deployment alone.
    caps: tuple[Cap, ...] = ()

    def with_caps(self, caps: tuple[Cap, ...]) -> "Budget":
        """The same budget, admitting only what also fits `caps`."""
        return self if caps == self.caps else replace(self, caps=caps)

    @property
    def split(self) -> bool:
        """Input tokens have a bucket of their own (ITPM beside OTPM)."""
        return self.itpm > 0

    @property
    def input_rate(self) -> float:
        return self.itpm / 60

    @property
    def input_capacity(self) -> float:
        return self.itpm * self.burst_seconds / 60

    @property
    def request_rate(self) -> float:
        return self.rpm / 60

    @property
    def token_rate(self) -> float:
        return self.tpm / 60

    @property
    def request_capacity(self) -> float:
        return self.rpm * self.burst_seconds / 60

    @property
    def token_capacity(self) -> float:
        return self.tpm * self.burst_seconds / 60

    def check_fits(self, cost: int, input_cost: int = 0) -> None:
        for cap in self.caps:
            _check_cap(self, cap, cost + input_cost)
        if self.split:
            self._check_split(cost, input_cost)
        elif cost > self.token_capacity:
            raise RequestTooLarge(
                f"the request needs {cost} tokens (prompt estimate + max_tokens) but deployment "
                f"{self.name!r} admits at most {self.token_capacity:.0f} at once "
                f"(tpm {self.tpm:g} x burst_seconds {self.burst_seconds:g} / 60); "
                "lower max_tokens or shorten the prompt")

    def _check_split(self, cost: int, input_cost: int) -> None:
        for what, need, capacity, limit in (("input", input_cost, self.input_capacity, "itpm"),
                                            ("output", cost, self.token_capacity, "otpm")):
            if need > capacity:
                rate = self.itpm if limit == "itpm" else self.tpm
                raise RequestTooLarge(
                    f"the request needs {need} {what} tokens but deployment {self.name!r} "
                    f"admits at most {capacity:.0f} at once ({limit} {rate:g} x burst_seconds "
                    f"{self.burst_seconds:g} / 60); "
                    + ("shorten the prompt" if what == "input" else "lower max_tokens"))

    @cached_property
    def packed(self) -> str:
        """The budget as bucket.lua's ARGV[2] reads it, built once."""
        numbers: tuple[float, ...] = (
            self.request_rate, self.request_capacity, self.token_rate, self.token_capacity,
            self.flight_timeout_s, int(self.refunds))
        if self.split:
            numbers += (self.input_rate, self.input_capacity)
        return "".join((" ".join(repr(float(n)) for n in numbers),
                        *(" ; " + cap.packed(self.burst_seconds) for cap in self.caps)))


def _check_cap(budget: Budget, cap: Cap, tokens: int) -> None:
    """A request larger than a cap's bucket could never be admitted: refuse it now."""
    capacity = cap.capacities(budget.burst_seconds)[1]
    if cap.tpm and tokens > capacity:
        whose = cap.scope.replace(":", " ", 1)
        raise RequestTooLarge(
            f"the request needs {tokens} tokens but the {whose}'s cap admits at most "
            f"{capacity:.0f} at once on deployment {budget.name!r} (tpm cap {cap.tpm:g} x "
            f"burst_seconds {budget.burst_seconds:g} / 60); lower max_tokens or raise the cap")
