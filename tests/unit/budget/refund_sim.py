"""A replay of workers, a network and a strict provider on one simulated clock, for the
refund learning tests: the headers quotaflow's limiter is clamped with, in the order and
at the times a busy host delivers them.

The provider is mock_provider's own buckets (an independent judge, not quotaflow's
limiter), driven by the same clock. Each simulated worker process admits a chunk, sends
its calls (each after its own delay: the network, a process starved of CPU), and reports
answers in a flush that may come late (a worker descheduled between reading an answer
and telling the limiter). Every header the limiter receives is recorded, so a test can
replay a recorded sequence or check what was learned at each step.
"""

import heapq
import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from mock_provider.buckets import RateLimits
from quotaflow.budget.buckets import LocalLimiter
from quotaflow.budget.limiter import Admission, Dating, Settlement
from quotaflow.deployments.limits import Budget, Refunds

COST, USED = 108, 21  # a request's reservation (prompt + max_tokens) and its real usage


@dataclass
class Clock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Jitter:
    """Delays drawn per call: to reach the provider, its latency, to come back, and the
    wait before the worker reports it (its flush)."""

    send_s: tuple[float, float] = (0.0, 0.01)
    latency_s: float = 0.2
    back_s: tuple[float, float] = (0.0, 0.01)
    flush_s: tuple[float, float] = (0.0, 0.02)
    # A process starved of CPU: with this chance a chunk's sends, or a flush, wait up to
    # `stall_s` more.
    stall_p: float = 0.0
    stall_s: float = 0.0
    # A provider refusing this share of calls 429 at random, before counting them.
    faults: float = 0.0


@dataclass
class Replay:
    """What happened: the headers in the order the limiter got them, 429s, and whether
    the limiter was spending refunds after each header."""

    # (when the limiter got it, tokens remaining, its call's dating, when it was answered)
    headers: list[tuple[float, float, Dating, float]] = field(default_factory=list)
    refunding: list[bool] = field(default_factory=list)
    rejected: int = 0
    admitted: int = 0


class _World:
    """The event loop: one handler per kind of event, in time order."""

    def __init__(self, provider_refunds: bool, jitter: Jitter, seconds: float, budget: Budget,
                 provider: RateLimits, limiter: LocalLimiter, clock: Clock, chunk: int,
                 seed: int) -> None:
        self.refunds, self.jitter, self.seconds = provider_refunds, jitter, seconds
        self.budget, self.provider, self.limiter, self.clock = budget, provider, limiter, clock
        self.chunk = chunk
        self.rng = random.Random(seed)
        self.replay = Replay()
        self.events: list[tuple[float, int, str, tuple]] = []
        self.order = itertools.count()
        self.outstanding: dict[int, int] = {}
        self.flushes: dict[int, list[tuple[Settlement, float | None, Dating, float]]] = {}

    def at(self, when: float, kind: str, *args: object) -> None:
        heapq.heappush(self.events, (when, next(self.order), kind, args))

    def draw(self, span: tuple[float, float]) -> float:
        return self.rng.uniform(*span)

    def stall(self) -> float:
        jitter = self.jitter
        return self.rng.uniform(0, jitter.stall_s) if self.rng.random() < jitter.stall_p else 0.0

    def run(self) -> Replay:
        while self.events:
            when, _, kind, args = heapq.heappop(self.events)
            self.clock.now = when
            getattr(self, kind)(when, *args)
        return self.replay

    def acquire(self, when: float, worker: int) -> None:
        if when > self.seconds:
            return
        admission: Admission = self.limiter.acquire(self.budget, [COST] * self.chunk, 0.0)
        if not admission.admitted:
            self.at(when + max(0.001, min(admission.wait_s, 0.05)), "acquire", worker)
            return
        self.outstanding[worker] = admission.admitted
        late = self.stall()
        for _ in range(admission.admitted):  # dated as execution/admitted.py does
            self.at(when + late + self.draw(self.jitter.send_s), "arrive", worker,
                    admission.slot, admission.dating(COST))

    def arrive(self, when: float, worker: int, slot: int, dating: Dating) -> None:
        if self.rng.random() < self.jitter.faults:  # refused uncounted, no headers
            self.at(when + self.draw(self.jitter.back_s), "answer", worker, slot, dating, None,
                    False)
            return
        decision = self.provider.try_admit(COST)
        if not decision.admitted:
            self.replay.rejected += 1
            self.at(when + self.draw(self.jitter.back_s), "answer", worker, slot, dating, None,
                    False)
            return
        self.replay.admitted += 1
        seen = None if self.refunds else decision.remaining_tokens  # headers at admission
        self.at(when + self.jitter.latency_s, "done", worker, slot, dating, seen)

    def done(self, when: float, worker: int, slot: int, dating: Dating,
             seen: float | None) -> None:
        if self.refunds:  # billed its real usage: headers after the refund
            seen = self.provider.settle(COST - USED).remaining_tokens
        self.at(when + self.draw(self.jitter.back_s), "answer", worker, slot, dating, seen, True)

    def answer(self, when: float, worker: int, slot: int, dating: Dating, seen: float | None,
               ok: bool) -> None:
        pending = self.flushes.setdefault(worker, [])
        pending.append((Settlement(slot, COST, float(COST - USED) if ok else 0.0,
                                   answered=ok), seen, dating, when))
        if len(pending) == 1:
            self.at(when + self.draw(self.jitter.flush_s) + self.stall(), "flush", worker)

    def flush(self, when: float, worker: int) -> None:
        pending = self.flushes.pop(worker, [])
        self.limiter.settle(self.budget, [entry[0] for entry in pending])
        headers = [entry[1:] for entry in pending if entry[1] is not None]
        if headers:
            seen, dating, answered = headers[-1]  # the newest, as feedback.py does
            assert seen is not None
            self.replay.headers.append((when, seen, dating, answered))
            self.limiter.clamp(self.budget, None, seen, dating)
            self.replay.refunding.append(self.limiter.levels(self.budget).refunding)
        self.outstanding[worker] -= len(pending)
        if self.outstanding[worker] <= 0:
            self.at(when, "acquire", worker)


def simulate(provider_refunds: bool, jitter: Jitter, seconds: float = 20.0,
             rpm: int = 6_000, tpm: int = 600_000, burst_s: float = 60.0, workers: int = 8,
             chunk: int = 16, seed: int = 1, margin_s: float = 0.25,
             limiter_factory: Callable[[Clock], LocalLimiter] = LocalLimiter) -> Replay:
    """Run the workers against a provider that gives back unused reservations or keeps
    them, the limiter in refund mode "learned", for `seconds` of simulated time."""
    clock = Clock()
    world = _World(provider_refunds, jitter, seconds,
                   Budget("sim", rpm, tpm, burst_s, margin_s=margin_s, refunds=Refunds.LEARNED),
                   RateLimits(rpm, tpm, burst_s, clock=clock), limiter_factory(clock), clock,
                   chunk, seed)
    for worker in range(workers):
        world.at(world.rng.uniform(0, 0.05), "acquire", worker)
    return world.run()
