"""JSON in and out of the hot path: orjson, with the standard library as its fallback.

orjson is several times faster than json on the bodies quotaflow moves
(requests to providers, answers into PostgreSQL); json takes over only for
what orjson refuses (integers beyond 64 bits), so no valid input is lost.
"""

import json
from dataclasses import dataclass
from typing import Any

import orjson


@dataclass(frozen=True, slots=True)
class RawJson:
    """JSON text stored as it arrived (a provider's answer, already known to parse), so
    the hot path never turns it into objects and back into the same text."""

    text: bytes


def dumps(value: Any) -> bytes:
    if isinstance(value, RawJson):
        return value.text
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, ensure_ascii=False).encode()


def dumps_text(value: Any) -> str:
    return dumps(value).decode()


def loads(text: str | bytes) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)
