"""The ways real providers fail, on demand, so quotaflow's handling of them is tested.

Retries, the circuit breaker and client timeouts are only as good as the failures
they have met; a provider that always answers well proves none of them. Each
request draws at most one fault, by the configured fractions: a 429 storm
(refused although the budget has room), a 500, a connection reset (the response
is cut off mid-body), a hang (never answers; the client's timeout must fire) or a
malformed 200 (not JSON). Storms, 500s and resets happen before admission; hangs
and malformed answers after, since the provider did take the request.
"""

import asyncio
import random
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi.responses import JSONResponse, Response, StreamingResponse

BEFORE_ADMISSION = ("429", "500", "529", "reset")
AFTER_ADMISSION = ("hang", "malformed")
HANG_S = 3600.0
# A fault's name (`--fault KIND=...`, /stats, PUT /faults) and its field of Faults.
FIELDS = {"429": "storm_429", "500": "error_500", "529": "overloaded_529", "reset": "reset",
          "hang": "hang", "malformed": "malformed"}


@dataclass
class Faults:
    """Fractions (0..1) of requests that meet each fault; they must add up to at most 1."""

    storm_429: float = 0.0
    error_500: float = 0.0
    overloaded_529: float = 0.0  # Anthropic's overloaded_error
    reset: float = 0.0
    hang: float = 0.0
    malformed: float = 0.0
    # The retry-after the simulated 429 storm asks for, in seconds.
    retry_after_s: float = 1.0
    seen: Counter[str] = field(default_factory=Counter)
    rng: random.Random = field(default_factory=random.Random)

    def __post_init__(self) -> None:
        fractions = self.fractions()
        if any(not 0 <= f <= 1 for f in fractions.values()) or sum(fractions.values()) > 1:
            raise ValueError(f"fault fractions must be within 0..1 and add up to at most 1: "
                             f"{fractions}")

    def fractions(self) -> dict[str, float]:
        return {"429": self.storm_429, "500": self.error_500, "529": self.overloaded_529,
                "reset": self.reset, "hang": self.hang, "malformed": self.malformed}

    def draw(self) -> str | None:
        """The fault this request meets, if any."""
        roll = self.rng.random()
        for name, fraction in self.fractions().items():
            if roll < fraction:
                self.seen[name] += 1
                return name
            roll -= fraction
        return None

    @classmethod
    def from_fractions(cls, fractions: dict[str, float], seen: Counter[str] | None = None,
                       retry_after_s: float = 1.0) -> "Faults":
        """From {"500": 0.1, "hang": 0.01, ...}, the names `--fault` and /stats use."""
        unknown = set(fractions) - set(FIELDS)
        if unknown:
            raise ValueError(f"unknown fault {sorted(unknown)}; choose from {sorted(FIELDS)}")
        rates: dict[str, Any] = {FIELDS[name]: float(value) for name, value in fractions.items()}
        faults = cls(**rates, retry_after_s=retry_after_s)
        if seen is not None:
            faults.seen = seen
        return faults


def storm_429(retry_after_s: float = 1.0) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": "The server is overloaded (simulated 429 storm).",
                   "type": "requests", "param": None, "code": "rate_limit_exceeded"}},
        status_code=429, headers={"retry-after": str(max(1, round(retry_after_s))),
                                  "retry-after-ms": str(round(retry_after_s * 1000))})


def error_500() -> JSONResponse:
    return JSONResponse(
        {"error": {"message": "The server had an error (simulated).", "type": "server_error",
                   "param": None, "code": None}}, status_code=500)


def overloaded_529() -> JSONResponse:
    """Anthropic's overloaded_error: the provider's capacity, not the caller's limit."""
    return JSONResponse({"type": "error", "error": {"type": "overloaded_error",
                                                    "message": "Overloaded (simulated)"}},
                        status_code=529)


def reset() -> StreamingResponse:
    """Announce a body, send part of it, then drop the connection."""

    async def cut_off() -> AsyncIterator[bytes]:
        yield b'{"id": "chatcmpl-cut'
        raise ConnectionResetError("simulated connection reset")

    return StreamingResponse(cut_off(), media_type="application/json",
                             headers={"content-length": "4096"})


async def hang() -> None:
    await asyncio.sleep(HANG_S)


def malformed() -> Response:
    return Response(b'{"choices": [ this is not json', status_code=200,
                    media_type="application/json")


def refusal(fault: str, retry_after_s: float = 1.0) -> Response:
    """The answer of a fault met before admission (one of BEFORE_ADMISSION)."""
    if fault == "429":
        return storm_429(retry_after_s)
    return {"500": error_500, "529": overloaded_529, "reset": reset}[fault]()
