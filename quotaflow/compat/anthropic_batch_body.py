"""The body of POST /v1/messages/batches, read as the JSONL file ingest takes.

{"requests": [{"custom_id": ..., "params": {...}}, ...]} is walked one request at a
time, as ingest reads, and each request is handed on as one Anthropic-format line
(quotaflow/ingest/formats.py reads those): the very bytes the client sent, with the line
breaks JSON allows between tokens made spaces, so no request is encoded again and
the body never exists as Python objects all at once. The bytes are decoded as
Latin-1 for the walk: one character per byte, so the decoder's positions are byte
offsets and the text costs one byte a byte whatever the prompts hold (UTF-8 is
checked where the line is parsed again). What Anthropic refuses at creation (not
JSON, no requests, too many, a request that is not {custom_id, params}, a custom_id
off its pattern or used twice) refuses the whole batch, naming the request; what
the params say is the line's own business, as for any file: a bad one becomes that
request's `errored` result. The batch's `anthropic-beta` header is the one thing added
to the bytes: each request whose params name no betas of their own gets the header's
as `params.betas` (sent as the header again by the workers, providers/anthropic.py).
"""

import io
import json
import re
from collections.abc import Generator, Iterator
from typing import Any

from quotaflow.compat.files import ChunkStream
from quotaflow.errors import FileTooLarge, InvalidRequest

CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_SPACE = re.compile(r"[ \t\n\r]*")
_LATIN1_RUN = re.compile(r"[\x00-\xff]+")
_LINE_BREAKS = bytes.maketrans(b"\n\r", b"  ")


class BatchBodyError(InvalidRequest):
    """The body cannot be a Message Batch; the message names the request at fault."""


class BatchTooLarge(FileTooLarge):
    """A body over QUOTAFLOW_MAX_MESSAGE_BATCH_BYTES (Anthropic's 256 MB); nothing is kept."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the Message Batch is larger than the limit of {limit} bytes "
                         "(QUOTAFLOW_MAX_MESSAGE_BATCH_BYTES); split it")


def open_requests(body: bytes, max_requests: int, betas: tuple[str, ...] = ()
                  ) -> io.BufferedReader:
    """The body's requests as a buffered JSONL stream (what ingest.create_job reads), made
    as they are read. Raises BatchBodyError from read() at the first thing Anthropic would
    refuse: ingest is then inside its transaction, so nothing of the batch is stored.
    `betas`, the batch's anthropic-beta header, become each request's `params.betas`
    where it names none of its own (with_betas)."""
    return io.BufferedReader(ChunkStream(_lines(body.decode("latin-1"), max_requests, betas)),
                             1024 * 1024)


_DECODER = json.JSONDecoder()


def _lines(text: str, max_requests: int, betas: tuple[str, ...]) -> Iterator[bytes]:
    """{"requests": [...]}: each request checked and yielded as one line."""
    at = _expect(text, _skip(text, 0), "{", "the body must be a JSON object")
    seen_requests = False
    while True:
        at = _skip(text, at)
        if text.startswith("}", at) and not seen_requests:
            break
        key, at = _value(text, at, "a key")
        if key != "requests":
            raise BatchBodyError(f"{_utf8(str(key))}: Extra inputs are not permitted")
        if seen_requests:
            raise BatchBodyError("requests: given twice")
        seen_requests = True
        at = _expect(text, _skip(text, at), ":", "expected ':'")
        at = _expect(text, _skip(text, at), "[", "requests: Input should be a valid list")
        at = yield from _requests(text, at, max_requests, betas)
        at = _skip(text, at)
        if text.startswith(",", at):
            at += 1
            continue
        at = _expect(text, at, "}", "expected ',' or '}'")
        break
    if not seen_requests:
        raise BatchBodyError("requests: Field required")
    if _skip(text, at) != len(text):
        raise BatchBodyError(f"the body is not valid JSON: extra data at byte {at}")


def _requests(text: str, at: int, max_requests: int, betas: tuple[str, ...]
              ) -> Generator[bytes, None, int]:
    """The array's elements as lines; returns the position after its closing bracket."""
    ids: dict[str, int] = {}
    index = 0
    at = _skip(text, at)
    if text.startswith("]", at):
        raise BatchBodyError("requests: List should have at least 1 item after validation, "
                             "not 0")
    while True:
        if index == max_requests:
            raise BatchBodyError(f"requests: a Message Batch holds at most {max_requests} "
                                 "requests (QUOTAFLOW_MAX_MESSAGE_BATCH_REQUESTS); split it")
        start = at
        request, at = _value(text, at, f"requests.{index}")
        _check(request, index, ids)
        line = text[start:at]
        if betas and "betas" not in request["params"]:
            line = with_betas(line, betas)
        yield line.encode("latin-1").translate(_LINE_BREAKS) + b"\n"
        index += 1
        at = _skip(text, at)
        if text.startswith(",", at):
            at = _skip(text, at + 1)
            continue
        return _expect(text, at, "]", "requests: expected ',' or ']'")


def with_betas(request: str, betas: tuple[str, ...]) -> str:
    """One request's text with `"betas": [...]` added at the end of its params object,
    the rest of its bytes as sent (the request was checked: an object with params)."""
    at = _expect(request, _skip(request, 0), "{", "expected '{'")
    while True:
        key, at = _value(request, _skip(request, at), "a key")
        at = _skip(request, _expect(request, _skip(request, at), ":", "expected ':'"))
        value, end = _value(request, at, str(key))
        if key == "params":
            close = end - 1  # the params object's closing brace
            separator = "," if value else ""
            return (f"{request[:close]}{separator}\"betas\":{json.dumps(list(betas))}"
                    f"{request[close:]}")
        at = _skip(request, end)
        at = _expect(request, at, ",", "expected ','")


def _check(request: Any, index: int, ids: dict[str, int]) -> None:
    """Anthropic's checks of one request at creation (its params are checked as a line's)."""
    where = f"requests.{index}"
    if not isinstance(request, dict):
        raise BatchBodyError(f"{where}: Input should be a valid dictionary")
    for key in request:
        if key not in ("custom_id", "params"):
            raise BatchBodyError(f"{where}.{_utf8(key)}: Extra inputs are not permitted")
    for key in ("custom_id", "params"):
        if key not in request:
            raise BatchBodyError(f"{where}.{key}: Field required")
    custom_id = request["custom_id"]
    if not isinstance(custom_id, str) or not CUSTOM_ID.match(custom_id):
        raise BatchBodyError(f"{where}.custom_id: String should match pattern "
                             f"'{CUSTOM_ID.pattern}'")
    if not isinstance(request["params"], dict):
        raise BatchBodyError(f"{where}.params: Input should be a valid dictionary")
    earlier = ids.setdefault(custom_id, index)
    if earlier != index:
        raise BatchBodyError(f"{where}.custom_id: duplicate custom_id {custom_id!r} (also "
                             f"requests.{earlier}.custom_id); each custom_id must be unique "
                             "within a Message Batch")


def _value(text: str, at: int, what: str) -> tuple[Any, int]:
    try:
        return _DECODER.raw_decode(text, at)
    except json.JSONDecodeError as exc:
        raise BatchBodyError(f"the body is not valid JSON at byte {exc.pos} ({what}): "
                             f"{exc.msg}") from None
    except RecursionError:
        raise BatchBodyError(f"{what}: nested too deeply") from None


def _skip(text: str, at: int) -> int:
    match = _SPACE.match(text, at)
    assert match is not None  # the pattern matches the empty string
    return match.end()


def _expect(text: str, at: int, char: str, message: str) -> int:
    if not text.startswith(char, at):
        raise BatchBodyError(message if at < len(text)
                             else f"the body is not valid JSON: it ends at byte {at}")
    return at + 1


def _utf8(latin1: str) -> str:
    """A key as the client wrote it (the walk sees UTF-8 bytes as Latin-1 characters;
    a character written as a JSON escape, `\\ud83d\\ude00`, is itself already)."""
    return _LATIN1_RUN.sub(
        lambda run: run.group().encode("latin-1").decode("utf-8", "replace"), latin1)
