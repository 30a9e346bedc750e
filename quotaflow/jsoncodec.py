"""JSON in and out of the hot path: orjson, with the standard library as its fallback.

orjson is several times faster than json on the bodies quotaflow moves
(requests to providers, answers into PostgreSQL); json takes over only for
what orjson refuses (integers beyond 64 bits), so no valid input is lost.
"""

import json
import re
from dataclasses import dataclass
from typing import Any

import orjson

# orjson turns an integer beyond 64 bits into a float: one of 20 or more digits, or a
# negative one of 19 below -2**63 (-9223372036854775809). Text holding either takes the
# standard library's parser, which keeps the number exact (as PostgreSQL does). Digits
# and the minus sign map to "0", all else to " ", so a run of 20 is a substring test (a
# regex is 7x slower); a run the minus sign lengthens ("555-0100-...") only costs the
# slower parser.
_DIGITS_ONLY = bytes(48 if 48 <= byte <= 57 or byte == 45 else 32 for byte in range(256))
_LONG_NUMBER = b"0" * 20


def has_long_number(raw: bytes) -> bool:
    """Whether orjson might round a number in `raw`."""
    return _LONG_NUMBER in raw.translate(_DIGITS_ONLY)


@dataclass(frozen=True, slots=True)
class RawJson:
    """JSON text stored as it arrived (a provider's answer, already known to parse), so
    the hot path never turns it into objects and back into the same text."""

    text: bytes


# A \u0000 escape that is one (not an escaped backslash followed by "u0000").
_NUL_ESCAPE = re.compile(rb"(?<!\\)((?:\\\\)*)\\u0000")


def without_nul(text: bytes) -> bytes:
    """JSON text PostgreSQL can store: JSONB holds no NUL character, so a provider's
    answer carrying one (\u0000) would fail the write of its whole chunk. Each becomes
    U+FFFD, the replacement character; everything else is kept as it came."""
    if b"\\u0000" not in text:
        return text
    return _NUL_ESCAPE.sub(rb"\1\\ufffd", text)


def dumps(value: Any) -> bytes:
    if isinstance(value, RawJson):
        return without_nul(value.text)
    try:
        return without_nul(orjson.dumps(value))
    except TypeError:
        return without_nul(json.dumps(value, ensure_ascii=False).encode())


def dumps_text(value: Any) -> str:
    return dumps(value).decode()


def loads(text: str | bytes) -> Any:
    """The JSON value of `text`; ValueError where it is not JSON. NaN and Infinity, which
    Python's json takes and JSON (and PostgreSQL) does not, are refused: an answer
    holding one, stored as it came, would fail its whole chunk's write."""
    raw = text.encode() if isinstance(text, str) else text
    if has_long_number(raw):
        return _slow_loads(raw)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _slow_loads(raw)


def _slow_loads(raw: str | bytes) -> Any:
    return json.loads(raw, parse_constant=_not_json)


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads_many(texts: list[str]) -> list[Any]:
    """loads of each, with the test for long numbers made once over them all (a claim
    parses a batch's bodies together: the per-text test cost as much as the parse)."""
    if has_long_number("\n".join(texts).encode()):
        return [loads(text) for text in texts]
    values = []
    for text in texts:
        try:
            values.append(orjson.loads(text))
        except orjson.JSONDecodeError:
            values.append(_slow_loads(text))
    return values
