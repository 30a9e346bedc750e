"""`quotaflow estimate` and `POST /jobs?dry_run=true`: what a file would cost and how long
it would take, before anything of it is stored.

The file goes through ingest's own pass (quotaflow/ingest/linescan.py), so a line the estimate
calls valid is one `submit` would accept, routed where submit would route it; the rows
go to a writer that writes nothing, so no job, item or result is made. Beside the
pass's per-route tallies (prompt tokens at characters / 4, completion ceilings) each
valid line's prompt is counted with its model's tokenizer (quotaflow/ingest/tokenizers.py):
that count is what the cost is computed from, the characters / 4 one is what the time
is (quotaflow/budget/job_time.py), because it is what the limiter admits by. The tenant's
limits are read once at the end, as the API sees them.

A file that cannot be read at all (too large, empty, too many lines) is refused with
the same InputFileError as submit; bad lines are listed, never raised.
"""

import hashlib
from dataclasses import dataclass, field
from typing import IO, Any

from sqlalchemy.orm import Session

from quotaflow.budget.job_time import duration as budget_duration
from quotaflow.budget.job_time import job_duration, route_budgets
from quotaflow.config import Settings
from quotaflow.constants import QUEUES
from quotaflow.deployments.catalog import Deployments
from quotaflow.deployments.pricing import CostRange, TokenTally
from quotaflow.errors import InputFileError, InvalidParameter, LineProblem
from quotaflow.ingest.linescan import LineScan
from quotaflow.ingest.tokenizers import CHARS_PER_4, TokenCounter, counter_for
from quotaflow.tenants import quotas, spend

SHOWN_ERRORS = 10  # the first few invalid lines the estimate lists
ESTIMATE_JOB = "estimate"  # LineScan's job id: it names the BatchRefs, which nobody sees


class _NoRows:
    """A RowWriter that keeps nothing: an estimate stores no row of the file."""

    def pending(self, line_no: int, custom_id: str, body: bytes, digest: bytes | None,
                route: str) -> None:
        pass

    def invalid(self, line_no: int, custom_id: str | None, request_id: str,
                error: bytes) -> None:
        pass

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


@dataclass
class _Counts:
    """What the estimate counts beside LineScan's tallies, line by line."""

    deployments: Deployments
    # By route: the tokens as the tokenizer counts them, tiers told apart as submit's are.
    tallies: dict[str, TokenTally] = field(default_factory=dict)
    thresholds: dict[str, tuple[int, ...]] = field(default_factory=dict)
    counters: dict[str, TokenCounter] = field(default_factory=dict)
    # 64-bit digests of the custom_ids seen: submit refuses a file that repeats one. A
    # set of ints, about 60 bytes a line (120 MB at the 2,000,000-line limit).
    ids: set[int] = field(default_factory=set)
    duplicates: list[LineProblem] = field(default_factory=list)

    def __call__(self, line_no: int, route: str, custom_id: str, text: str,
                 fixed: int = 0, completion: int = 0, writes: bool = False) -> None:
        """`fixed`: the line's images' and files' tokens (quotaflow/budget/image_tokens.py),
        which no tokenizer counts."""
        counter = self.counters.get(route)
        if counter is None:
            counter = self.counters[route] = counter_for(self._model(route))
            self.tallies[route] = TokenTally()
            self.thresholds[route] = self.deployments.route_price_marks(route)[0]
        self.tallies[route].add(counter.count(text) + fixed, completion, writes,
                                self.thresholds[route])
        key = int.from_bytes(hashlib.blake2b(custom_id.encode(errors="surrogatepass"),
                                             digest_size=8).digest())
        if key in self.ids:
            if len(self.duplicates) < SHOWN_ERRORS:
                self.duplicates.append(LineProblem(
                    line_no, f"duplicate custom_id {custom_id!r}; each custom_id must be "
                             "unique within a file, and submit refuses the file"))
        else:
            self.ids.add(key)

    def _model(self, route: str) -> str:
        """The model whose tokenizer counts a route's prompts: its first deployment's
        (the name the provider runs), or the route's name."""
        found = self.deployments.route_named(route)
        return self.deployments.deployments[found.deployments[0]].model if found else route


@dataclass(frozen=True)
class FileEstimate:
    """The pass's findings, before the tenant's limits are looked at."""

    scan: LineScan
    counts: _Counts
    queue: str
    floor: float

    @property
    def cost(self) -> tuple[CostRange | None, bool]:
        return spend.estimate(self.counts.deployments, self.counts.tallies.items())

    @property
    def submit_cost(self) -> CostRange | None:
        """The cost as submit counts it against the spend limit: prompts at characters / 4
        (ingest runs no tokenizer), so the estimate's verdict is submit's."""
        return spend.estimate(self.counts.deployments, self.scan.routes.items())[0]


def scan_file(stream: IO[bytes], settings: Settings, deployments: Deployments,
              queue: str) -> FileEstimate:
    """Read the file once, storing nothing; raise only when it cannot be read at all."""
    if queue not in QUEUES:
        raise InvalidParameter("queue", f"unknown queue {queue!r}; choose one of "
                                        f"{', '.join(QUEUES)}")
    scan = LineScan(ESTIMATE_JOB, settings, deployments, room=None)
    counts = _Counts(deployments)
    scan.on_valid = counts
    scan.run(stream, _NoRows())
    if scan.total == 0:
        raise InputFileError("the file is empty: it has no request lines")
    return FileEstimate(scan, counts, queue, settings.floor_for(queue))


def estimate_object(found: FileEstimate, session: Session, settings: Settings,
                    tenant: str) -> dict[str, Any]:
    """The estimate as the API answers it (docs/formats/estimate.md)."""
    limits = tenant_limits(session, settings, tenant, found.scan.tokens, found.submit_cost,
                           found.counts.deployments.currency)
    return _estimate(found, limits)


def offline_object(found: FileEstimate) -> dict[str, Any]:
    """The estimate made without a cluster (`quotaflow estimate` with no API configured):
    the same object from the same deployments file, with `tenant` null, since a tenant's
    limits and what its unfinished batches hold are known only to the cluster's
    database."""
    return _estimate(found, None)


def _estimate(found: FileEstimate, limits: dict[str, Any] | None) -> dict[str, Any]:
    scan, counts, deployments = found.scan, found.counts, found.counts.deployments
    routes = [_route_object(found, route) for route in scan.routes]
    cost, complete = found.cost
    whole = job_duration(deployments, {
        route: (t.requests, t.prompt_tokens + t.max_completion_tokens)
        for route, t in scan.routes.items()}, found.floor)
    errors = sorted([*scan.problems[:SHOWN_ERRORS], *counts.duplicates],
                    key=lambda p: p.line_no)[:SHOWN_ERRORS]
    prompt = sum(tally.prompt_tokens for tally in counts.tallies.values())
    completion = sum(t.max_completion_tokens for t in scan.routes.values())
    totals = {"requests": scan.valid, "prompt_tokens": prompt,
              "admission_prompt_tokens": scan.tokens, "max_completion_tokens": completion,
              "cost": _cost_json(cost, complete),
              "seconds": round(whole.seconds, 3) if whole else 0.0}
    refusals = [p.reason for p in counts.duplicates[:1]]
    if not scan.valid:
        refusals.append("no line of the file is a valid request")
    refusals += [f"over the {name.replace('_', ' ')} limit"
                 for name, use in (limits or {}).items()
                 if isinstance(use, dict) and not use["fits"]]
    return {"object": "estimate", "queue": found.queue, "endpoint": scan.endpoint,
            "lines": {"total": scan.total, "valid": scan.valid,
                      "invalid": scan.total - scan.valid, "errors": [
                          {"line": p.line_no, "message": p.reason} for p in errors]},
            "routes": routes, "totals": totals, "tenant": limits,
            "submit_would_refuse": refusals}


def _route_object(found: FileEstimate, route: str) -> dict[str, Any]:
    tally, deployments = found.scan.routes[route], found.counts.deployments
    counted = found.counts.tallies[route]
    prompt = counted.prompt_tokens
    admission = tally.prompt_tokens + tally.max_completion_tokens
    budgets = route_budgets(deployments, route)
    time = budget_duration(budgets.values(), tally.requests, admission, found.floor) \
        if budgets else None
    named = deployments.route_named(route)
    counter = found.counts.counters.get(route)
    return {"route": route, "deployments": named.deployments if named else [],
            "requests": tally.requests,
            "tokenizer": counter.name if counter else CHARS_PER_4,
            "prompt_tokens": prompt, "admission_prompt_tokens": tally.prompt_tokens,
            "max_completion_tokens": tally.max_completion_tokens,
            "admission_tokens": admission,
            "cost": _cost_json(deployments.route_cost(route, counted), None),
            "time": time.as_json() if time else None}


def _cost_json(cost: CostRange | None, complete: bool | None
               ) -> dict[str, Any] | None:
    """A cost range; None where unknown (deployments without prices). The total says
    whether it covers every route (`complete`: false when some route's is unknown)."""
    if cost is None:
        return None
    shown: dict[str, Any] = {"low": round(cost.low, 6), "high": round(cost.high, 6),
                             "currency": cost.currency}
    if complete is not None:
        shown["complete"] = complete
    return shown


def tenant_limits(session: Session, settings: Settings, tenant: str, tokens: int,
                  cost: CostRange | None, currency: str) -> dict[str, Any]:
    """How much of the tenant's enqueued-token and monthly spend limits the file would
    use, as submit would count them (None where the tenant has no such limit)."""
    room = quotas.headroom(session, settings, tenant)
    enqueued = None if room.limit is None else {
        "limit": room.limit, "held": room.held, "this_file": tokens,
        "share_of_limit": round(tokens / room.limit, 6),
        "fits": room.held + tokens <= room.limit}
    month = spend.spend_room(session, settings, tenant)
    high = cost.high if cost else 0.0
    monthly = None if month.limit is None else {
        "currency": currency, "limit": month.limit, "spent": round(month.spent, 6),
        "left": round(month.left or 0, 6), "this_file_high": round(high, 6),
        "share_of_left": round(high / month.left, 6) if month.left else None,
        "fits": cost is None or (month.spent < month.limit and high <= (month.left or 0))}
    return {"name": tenant, "enqueued_tokens": enqueued, "monthly_spend": monthly}
