"""How long a job takes at its deployments' budgets: which of RPM or TPM binds, and when
the last request can be admitted when the workers use 100% of both.

The arithmetic is the limiter's own (quotaflow/budget/limiter.py, lua/bucket.lua), so the
figure is what the cluster really does, not a rule of thumb:

- a request costs one request and its admission tokens (about characters / 4 of
  the prompt plus max_tokens, quotaflow/budget/tokens.py): NOT the tokenizer's count,
  which is what the provider bills but not what it admits by;
- the buckets start full: `burst_seconds` worth of each per-minute limit is there
  at once, less the queue's floor (left to higher priorities) and the safety
  margin; the rest arrives at rpm / 60 and tpm / 60 a second;
- a route's budgets add up over its deployments (not its fallback, used only when
  they are all unavailable), and deployments sharing a `quota` count once.

So the last of N requests (T tokens) is admitted after max((N - A_r) / r_r,
(T - A_t) / r_t) seconds, A being what the buckets hold at once and r the refill
rate. The estimate assumes that the job has the budgets to itself, that the
workers keep up with them, and that the provider keeps each reservation (a
provider that gives back unused max_tokens lets a TPM-bound job finish sooner);
it does not add the last call's own latency.
"""

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from quotaflow.deployments.catalog import Deployments
from quotaflow.deployments.limits import Budget

RPM, TPM = "rpm", "tpm"


@dataclass(frozen=True)
class Duration:
    """A demand's time at a set of budgets: the longer of the two limits' times binds."""

    seconds: float
    binding: str  # "rpm" or "tpm"
    rpm_seconds: float  # what the requests alone would take
    tpm_seconds: float  # what the admission tokens alone would take
    rpm: float  # the budgets' summed limits
    tpm: float
    requests_at_once: float  # what the full buckets admit before any refill
    tokens_at_once: float

    def as_json(self) -> dict[str, object]:
        return {"seconds": round(self.seconds, 3), "binding": self.binding,
                "rpm_seconds": round(self.rpm_seconds, 3),
                "tpm_seconds": round(self.tpm_seconds, 3), "rpm": self.rpm, "tpm": self.tpm,
                "requests_at_once": round(self.requests_at_once, 3),
                "tokens_at_once": round(self.tokens_at_once, 1)}


def route_budgets(deployments: Deployments, route_name: str) -> dict[str, Budget]:
    """The budgets a route's requests spend, by limiter bucket name (a shared quota once)."""
    route = deployments.route_named(route_name)
    if route is None:
        return {}
    budgets = (_combined(deployments.deployments[name].budget) for name in route.deployments)
    return {budget.name: budget for budget in budgets}


def _combined(budget: Budget) -> Budget:
    """A split budget (itpm and otpm) as one tokens budget of itpm + otpm: the estimate
    counts prompt and max_tokens together, so it is approximate where one of the two
    binds (docs/deployments/anthropic.md)."""
    if not budget.split:
        return budget
    return dataclasses.replace(budget, tpm=budget.tpm + budget.itpm, itpm=0.0)


def duration(budgets: Iterable[Budget], requests: int, tokens: int, floor: float) -> Duration:
    """The time `requests` costing `tokens` in all take to be admitted from full buckets,
    at a queue whose floor is `floor` (0 for realtime)."""
    rpm = tpm = at_once_r = at_once_t = 0.0
    mean_cost = tokens / requests if requests else 0.0
    for budget in budgets:
        rpm += budget.rpm
        tpm += budget.tpm
        # bucket.lua: admitted while the bucket stays above floor x capacity + margin x
        # rate (never more than capacity less one request).
        cap_r, cap_t = budget.request_capacity, budget.token_capacity
        at_once_r += cap_r - min(floor * cap_r + budget.margin_s * budget.request_rate,
                                 cap_r - 1)
        at_once_t += cap_t - min(floor * cap_t + budget.margin_s * budget.token_rate,
                                 cap_t - mean_cost)
    if rpm <= 0 or tpm <= 0:
        raise ValueError("a duration needs at least one budget")
    rpm_s = max(0.0, (requests - at_once_r) / (rpm / 60))
    tpm_s = max(0.0, (tokens - at_once_t) / (tpm / 60))
    # Equal times (both 0: the job fits in the full buckets): the limit that would bind
    # at the refill rate alone is named.
    binding = RPM if (rpm_s, requests / rpm) >= (tpm_s, tokens / tpm) else TPM
    return Duration(max(rpm_s, tpm_s), binding, rpm_s, tpm_s, rpm, tpm, at_once_r, at_once_t)


def job_duration(deployments: Deployments, demand: Mapping[str, tuple[int, int]],
                 floor: float) -> Duration | None:
    """The job's time: routes that share a budget are one demand on their budgets
    together; unrelated ones run side by side, and the slowest group is the job's."""
    groups: list[tuple[dict[str, Budget], int, int]] = []
    for route, (requests, tokens) in demand.items():
        budgets = route_budgets(deployments, route)
        overlapping = [g for g in groups if g[0].keys() & budgets.keys()]
        for group in overlapping:
            groups.remove(group)
            budgets = {**group[0], **budgets}
            requests, tokens = requests + group[1], tokens + group[2]
        groups.append((budgets, requests, tokens))
    durations = [duration(b.values(), r, t, floor) for b, r, t in groups if b and r]
    return max(durations, key=lambda d: d.seconds, default=None)
