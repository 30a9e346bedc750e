"""What bound a job: where its time went, and what would have made it faster.

A job's time is cut into slices (the report's buckets). Each slice is put down to the
one thing that held the job back then, tested in this order:

1. **budget**: a deployment's bucket was empty. The job's own admissions in the slice
   reached 80% of a limit's refill (RPM, TPM, or ITPM/OTPM where input and output are
   limited apart) *and* everything it was admitted so far reached 80% of what the full
   buckets held at once (less the queue's floor) plus the refill since: a burst out of
   full buckets is not a wait, a refill-paced trickle is.
2. **paused**: a quarter or more of the slice's admissions were retries: the provider
   answered 429 (the deployment is paused for its Retry-After) or failed, or a circuit
   opened.
3. **provider**: a deployment had `max_concurrency` calls in flight (80% of it, on
   average over the slice): the run waited for the provider's answers to send more.
   After the last admission, the last calls' latency is the provider's too.
4. **workers**: none of these, yet work was left: the job waited for a worker to take
   its batches (every slot busy), or for the worker itself. Before its first admission
   the job waited in its queue.

It is computed from what workers already store with each result (the deployment, when
the call was admitted, sent and answered, its attempts: migration 0009), so it needs no
extra recording. It sees the job's own admissions only: a budget drained by other jobs at
the same time shows as workers or provider, not budget.
"""

from collections import defaultdict
from dataclasses import dataclass, field
from operator import itemgetter

BUDGET, PAUSED, PROVIDER, WORKERS = "budget", "paused", "provider", "workers"
FULL = 0.8  # a share of a limit or of max_concurrency that counts as all of it
RETRIED_SHARE = 0.25


@dataclass(frozen=True)
class Limits:
    """A deployment's limits as the buckets apply them to the job's queue."""

    name: str
    rpm: float
    tpm: float  # tokens in and out together; 0 where limited apart (itpm, otpm)
    itpm: float = 0.0
    otpm: float = 0.0
    burst_s: float = 60.0
    floor: float = 0.0  # the queue's share of each bucket left to higher priorities
    max_concurrency: int = 16

    def at_once(self, per_minute: float) -> float:
        """What the full bucket admits before any refill (bucket.lua, job_time.py)."""
        return per_minute * self.burst_s / 60 * (1 - self.floor)

    def held_back(self, per_minute: float) -> float:
        """What the floor keeps back of the full bucket, for higher priorities."""
        return per_minute * self.burst_s / 60 * self.floor


@dataclass
class Use:
    """What one deployment admitted of the job in one slice."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    retried: int = 0  # admissions of a call's second or later attempt


@dataclass
class Slice:
    start: float  # seconds since the job was created
    width: float
    use: dict[str, Use] = field(default_factory=dict)
    in_flight: dict[str, float] = field(default_factory=dict)  # mean calls in flight


@dataclass
class Timeline:
    """A job's slices, from its creation to its last answer (or now)."""

    queued_s: float  # creation to first admission
    slices: list[Slice]
    limits: dict[str, Limits]
    queue: str
    route: list[str] = field(default_factory=list)  # the deployments the job's routes name


@dataclass(frozen=True)
class Bound:
    """The verdict: seconds per cause, the top one, and what would make it faster."""

    seconds: dict[str, float]  # "budget: d rpm", "provider: d", "workers", "paused: d"...
    cause: str  # BUDGET, PAUSED, PROVIDER, WORKERS, or "" (nothing ran yet)
    deployment: str | None
    dimension: str | None  # rpm, tpm, itpm, otpm (budget only)
    advice: str

    @property
    def total_s(self) -> float:
        return sum(self.seconds.values())

    def as_json(self) -> dict[str, object]:
        total = self.total_s or 1.0
        return {"cause": self.cause, "deployment": self.deployment,
                "dimension": self.dimension, "advice": self.advice,
                "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
                "shares": {k: round(v / total, 4) for k, v in self.seconds.items()}}

    def summary(self) -> str:
        """One line: the top causes with their shares, then the advice."""
        total = self.total_s
        if not total:
            return self.advice
        top = sorted(self.seconds.items(), key=lambda kv: -kv[1])[:3]
        shares = ", ".join(f"{name} {secs / total:.0%}" for name, secs in top if secs > 0)
        return f"time went to {shares}. {self.advice}"


def classify(timeline: Timeline) -> Bound:
    """The job's time by cause, and its advice (see the module's docstring)."""
    seconds: defaultdict[str, float] = defaultdict(float)
    if timeline.queued_s > 0:
        seconds[f"{WORKERS}: queued"] += timeline.queued_s
    cumulative: dict[str, Use] = {}
    last = max((i for i, s in enumerate(timeline.slices)
                if any(u.requests for u in s.use.values())), default=-1)
    for index, piece in enumerate(timeline.slices):
        for name, use in piece.use.items():
            total = cumulative.setdefault(name, Use())
            total.requests += use.requests
            total.prompt_tokens += use.prompt_tokens
            total.completion_tokens += use.completion_tokens
        if index > last:
            label = _provider_label(piece)
        else:
            label = (_budget(timeline, piece, cumulative) or _paused(piece)
                     or _provider(timeline, piece) or WORKERS)
        seconds[label] += piece.width
    return _verdict(timeline, dict(seconds))


def _budget(timeline: Timeline, piece: Slice, cumulative: dict[str, Use]) -> str | None:
    """The fullest limit that bound the slice: `budget: NAME DIM`, or None."""
    best: tuple[float, str] | None = None
    elapsed = piece.start + piece.width - timeline.queued_s
    for name, use in piece.use.items():
        limits = timeline.limits.get(name)
        if limits is None:
            continue
        so_far = cumulative[name]
        for dimension, per_minute, now, total in _dimensions(limits, use, so_far):
            if per_minute <= 0:
                continue
            rate = per_minute / 60
            paced = now >= FULL * rate * piece.width
            # One slice's refill of slack: admissions lag the refill by up to a slice.
            drained = (total + rate * piece.width
                       >= FULL * (limits.at_once(per_minute) + rate * elapsed))
            share = now / (rate * piece.width)
            if paced and drained and (best is None or share > best[0]):
                best = (share, f"{BUDGET}: {name} {dimension}")
    return None if best is None else best[1]


def _dimensions(limits: Limits, use: Use,
                so_far: Use) -> list[tuple[str, float, float, float]]:
    """(dimension, per-minute limit, used in the slice, used so far) of each limit."""
    dims = [("rpm", limits.rpm, use.requests, so_far.requests)]
    if limits.itpm or limits.otpm:
        dims += [("itpm", limits.itpm, use.prompt_tokens, so_far.prompt_tokens),
                 ("otpm", limits.otpm, use.completion_tokens, so_far.completion_tokens)]
    else:
        dims.append(("tpm", limits.tpm, use.prompt_tokens + use.completion_tokens,
                     so_far.prompt_tokens + so_far.completion_tokens))
    return [(d, float(p), float(n), float(t)) for d, p, n, t in dims]


def _paused(piece: Slice) -> str | None:
    for name, use in sorted(piece.use.items(), key=lambda kv: -kv[1].retried):
        if use.retried and use.retried >= RETRIED_SHARE * use.requests:
            return f"{PAUSED}: {name}"
    return None


def _provider(timeline: Timeline, piece: Slice) -> str | None:
    for name, flying in sorted(piece.in_flight.items(), key=lambda kv: -kv[1]):
        limits = timeline.limits.get(name)
        if limits is not None and flying >= FULL * limits.max_concurrency:
            return f"{PROVIDER}: {name}"
    return None


def _provider_label(piece: Slice) -> str:
    """After the last admission: the last calls' answers (or nothing left in flight)."""
    flying = max(piece.in_flight.items(), key=lambda kv: kv[1], default=None)
    return f"{PROVIDER}: {flying[0]}" if flying and flying[1] > 0 else f"{PROVIDER}: last answers"


def _verdict(timeline: Timeline, seconds: dict[str, float]) -> Bound:
    if not any(s.use for s in timeline.slices):
        return Bound(seconds, "", None, None, "nothing was admitted yet: the job waits for "
                     "a worker to take its first batch")
    by_cause: defaultdict[str, float] = defaultdict(float)
    for label, secs in seconds.items():
        by_cause[label.split(":")[0]] += secs
    cause = max(by_cause.items(), key=itemgetter(1))[0]  # as Counter.most_common(1)
    top = max((k for k in seconds if k.split(":")[0] == cause), key=lambda k: seconds[k])
    _, _, rest = top.partition(": ")
    name, _, after_name = rest.partition(" ")
    deployment = name if name in timeline.limits else None
    dimension = after_name if cause == BUDGET and after_name else None
    advice = _advice(timeline, cause, deployment, dimension, sum(seconds.values()))
    return Bound(seconds, cause, deployment, dimension, advice)


def _advice(timeline: Timeline, cause: str, deployment: str | None, dimension: str | None,
            total_s: float) -> str:
    limits = timeline.limits.get(deployment or "")
    if cause == BUDGET and limits is not None and dimension is not None:
        per_minute = float(getattr(limits, dimension))
        held = limits.held_back(per_minute)
        if held and held / (per_minute / 60) >= 0.1 * total_s:
            return (f"the {timeline.queue} queue's floor kept {held:,.0f} of {deployment}'s "
                    f"{dimension.upper()} burst for higher priorities (about "
                    f"{held / (per_minute / 60):.0f} s of refill): submit it on a queue "
                    "with a lower floor, or lower QUOTAFLOW_FLOOR_"
                    f"{timeline.queue.upper()}")
        others = [d for d in timeline.route if d != deployment]
        more = (f"the route's other deployments ({', '.join(others)}) share the work"
                if others else "another deployment on the route would add its budget")
        return (f"nothing to tune: the budget is the limit ({deployment}'s "
                f"{dimension.upper()} {per_minute:,.0f}/min); only a higher limit "
                f"would make it faster, or {more}")
    if cause == PAUSED:
        return (f"the provider refused calls on {deployment} (429s or errors: the "
                "deployment paused, or its circuit opened): check that its rpm/tpm match "
                "the provider's real limits, or add another deployment to the route")
    if cause == PROVIDER and limits is not None:
        return (f"raise {deployment}'s max_concurrency (now {limits.max_concurrency}) if "
                "the provider takes more calls at once, or add another deployment to the "
                "route: the budget had room, the calls in flight were full")
    if cause == PROVIDER:
        return "the provider's answers: the last calls' latency"
    return ("more workers, or a higher `quotaflow worker --concurrency`: the budget had "
            "room and the calls in flight were below max_concurrency, so the job waited "
            "for a worker to take its batches")
