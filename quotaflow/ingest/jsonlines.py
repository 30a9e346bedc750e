"""A JSONL file's lines and each line's JSON object, or why a line has none.

The file is read in 1 MiB blocks and never held whole; orjson parses the good
lines. Whatever a line holds, it is refused on its own and never fails the file:
no JSON that nests deeper than MAX_DEPTH, holds NaN, a NUL, a lone surrogate or
an integer longer than MAX_INTEGER_DIGITS reaches the database or a provider.
"""

import json
from collections.abc import Iterator
from typing import IO, Any

import orjson

from quotaflow.errors import InputFileError
from quotaflow.jsoncodec import has_long_number

# Containers nested in one line. Real requests nest about 6 deep (tool schemas a few
# more); deeper JSON is refused before anything recurses over it: orjson writes at
# most 255 levels, Python's json recurses until RecursionError.
MAX_DEPTH = 64
# Digits of one integer. An integer beyond 1.8e308 (309 digits) is one no provider's
# JSON parser reads (JavaScript, Go and serde take numbers as doubles; Python stops at
# 4,300 digits), so it can only fail at the provider; up to this many are kept exact.
MAX_INTEGER_DIGITS = 308
_BLOCK = 1024 * 1024
# Every byte but an opening bracket or a newline: deleted, a block's lines keep only their
# brackets (at most MAX_DEPTH of them and the line cannot nest deeper).
_ALL_BUT_OPENERS = bytes(byte for byte in range(256) if byte not in b"{[\n")
BOM = b"\xef\xbb\xbf"  # a UTF-8 byte-order mark, which Excel and PowerShell write
NUL_REASON = "line contains a NUL character (\\u0000), which cannot be stored; remove it"
DEPTH_REASON = f"line is nested more than {MAX_DEPTH} levels deep"
SURROGATE_REASON = ("line is not valid JSON: it holds a lone surrogate escape (such as "
                    "\\ud800), which is not a character")


def read_lines(stream: IO[bytes], max_line_bytes: int,
               max_file_bytes: int | None = None) -> Iterator[tuple[int, bytes | None]]:
    """(line number, line without its newline) in large reads; None for a line longer
    than max_line_bytes, which is skipped without being held. A leading UTF-8 byte-order
    mark is not part of the first line."""
    for line_no, raw, _ in read_screened_lines(stream, max_line_bytes, max_file_bytes,
                                               screen=False):
        yield line_no, raw


def read_screened_lines(stream: IO[bytes], max_line_bytes: int,
                        max_file_bytes: int | None = None, screen: bool = True,
                        ) -> Iterator[tuple[int, bytes | None, bool]]:
    """read_lines's lines, each with whether it is known to be plain: its block holds no
    number orjson could round and no NUL escape, and the line has at most MAX_DEPTH
    brackets, so load_object may skip its own tests of these (`screened`). The tests run
    once over each 1 MiB block instead of once a line, which cost ingest a quarter of its
    time a line; a block where one of them finds something leaves each of its lines to
    load_object's own tests, as does a line that starts in the block before."""
    line_no, carry, skipping = 0, b"", False
    block = _first_block(stream)
    read = len(block)
    if block.startswith(BOM):
        block = block[len(BOM):]
        if not block:  # the first read was the mark alone
            block = stream.read(_BLOCK)
            read += len(block)
    while block:
        if max_file_bytes is not None and read > max_file_bytes:
            raise InputFileError(f"the file is larger than the limit of {max_file_bytes} "
                                 "bytes (QUOTAFLOW_MAX_FILE_BYTES)")
        pieces = block.split(b"\n")
        rest = pieces.pop()
        if pieces:
            # Each line's opening brackets (the bytes between its newlines once all else is
            # deleted), when the block holds nothing else to look at.
            marks = (block.translate(None, _ALL_BUT_OPENERS).split(b"\n")
                     if screen and _plain_block(block) else None)
            first_is_whole = not carry and not skipping
            pieces[0] = b"" if skipping else carry + pieces[0]
            for index, piece in enumerate(pieces):
                line_no += 1
                if len(piece) > max_line_bytes or skipping:
                    yield line_no, None, False
                    skipping = False
                    continue
                yield line_no, piece, (marks is not None and (index > 0 or first_is_whole)
                                       and len(marks[index]) <= MAX_DEPTH)
            carry = b""
        if not skipping:
            carry += rest
            if len(carry) > max_line_bytes:
                carry, skipping = b"", True
        block = stream.read(_BLOCK)
        read += len(block)
    if carry or skipping:
        yield line_no + 1, None if skipping else carry, False


def _plain_block(block: bytes) -> bool:
    """No number orjson could round and no NUL escape anywhere in the block."""
    return b"\\u0000" not in block and not has_long_number(block)


def _first_block(stream: IO[bytes]) -> bytes:
    """The first read, long enough to tell whether it starts with a byte-order mark (a
    stream may hand out fewer bytes than asked)."""
    block = stream.read(_BLOCK)
    while block and len(block) < len(BOM) and BOM.startswith(block):
        more = stream.read(_BLOCK)
        if not more:
            break
        block += more
    return block


def load_object(raw: bytes, screened: bool = False) -> dict[str, Any] | str:
    """A line's JSON object, or the reason it is not one.

    orjson parses the good lines (several times faster than json, and ingest reads
    millions); a line it refuses is parsed again by the standard library only to word
    the reason exactly as before (or to accept a number orjson cannot hold exactly).
    A `screened` line (read_screened_lines) skips the tests its block already passed.
    """
    if screened:
        try:
            obj = orjson.loads(raw)
        except ValueError:
            obj = _load_slowly(raw)
            if isinstance(obj, str):
                return obj
        return obj if isinstance(obj, dict) else (
            f"line must be a JSON object, not {type(obj).__name__}")
    try:
        if has_long_number(raw):
            raise ValueError("a long number: let the standard library parse it")
        obj = orjson.loads(raw)
    except ValueError:  # orjson.JSONDecodeError is a ValueError
        obj = _load_slowly(raw)
        if isinstance(obj, str):
            return obj
    if not isinstance(obj, dict):
        return f"line must be a JSON object, not {type(obj).__name__}"
    # Only a line with more brackets than MAX_DEPTH can nest deeper: the common line
    # costs two byte counts, not a walk over its object.
    if raw.count(b"{") + raw.count(b"[") > MAX_DEPTH and _nests_deeper(obj, MAX_DEPTH):
        return DEPTH_REASON
    if b"\\u0000" in raw and _has_nul(obj):
        # PostgreSQL can store no NUL in text or JSONB; no model needs one.
        return NUL_REASON
    return obj


def _load_slowly(raw: bytes) -> Any:
    """The standard library's reading of a line: the value, or why it is refused."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"line is not valid UTF-8 (byte {exc.start + 1})"
    try:
        obj = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite,
                         parse_int=_integer)
    except json.JSONDecodeError as exc:
        return f"line is not valid JSON: {exc.msg} at column {exc.colno}"
    except _NotJson as exc:
        return f"line is not valid JSON: {exc}"
    except RecursionError:  # orjson refused it past 1,024 levels; json recursed on
        return DEPTH_REASON
    try:  # what orjson refused and json took, e.g. a lone surrogate (\\ud800)
        orjson.dumps(obj)
    except TypeError as exc:  # orjson.JSONEncodeError is a TypeError
        if "surrogates" in str(exc):
            return SURROGATE_REASON
        if "64-bit" not in str(exc) and "Recursion" not in str(exc):
            return f"line is not valid JSON: {exc}"
        # big integers are fine (JSONB keeps them exact); depth is load_object's to refuse
    return obj


class _NotJson(ValueError):
    """What json.loads takes but JSON (and PostgreSQL) does not: NaN, Infinity, 1e400;
    and what no provider reads: an integer of more than MAX_INTEGER_DIGITS digits."""


def _refuse_constant(name: str) -> Any:
    raise _NotJson(f"{name} is not allowed")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise _NotJson(f"number {text} is out of range")
    return value


def _integer(text: str) -> int:
    """An integer literal, unless it has more digits than a provider could read (a longer
    one also stops int() at 4,300 digits, with an error that is no line's reason)."""
    digits = len(text) - text.startswith("-")
    if digits > MAX_INTEGER_DIGITS:
        raise _NotJson(f"an integer of {digits} digits is out of range (at most "
                       f"{MAX_INTEGER_DIGITS})")
    return int(text)


def _nests_deeper(value: Any, levels: int) -> bool:
    """Whether arrays and objects nest more than `levels` deep in `value` (recursing at
    most levels + 1 calls, however deep the value)."""
    if isinstance(value, dict):
        children: Any = value.values()
    elif isinstance(value, list):
        children = value
    else:
        return False
    return levels == 0 or any(_nests_deeper(child, levels - 1) for child in children)


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False
