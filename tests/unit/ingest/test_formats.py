"""Input lines in every accepted shape, and every way a line can be refused."""

import io
import json

import pytest

from quotaflow.ingest import jsonlines
from quotaflow.ingest.formats import BadLine, Request, parse_stream
from quotaflow.ingest.jsonlines import MAX_DEPTH, MAX_INTEGER_DIGITS
from quotaflow.results.output import output_line
from tests.harness.factories import HOSTILE_LINES

LIMIT = 4096


def parse(text: bytes) -> list[Request | BadLine]:
    return list(parse_stream(io.BytesIO(text), LIMIT))


def openai_line(custom_id: str = "a", **overrides: object) -> dict:
    line = {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]}}
    line.update(overrides)
    return line


def test_openai_line_is_taken_as_is() -> None:
    [entry] = parse(json.dumps(openai_line()).encode())
    assert entry == Request(1, "a", "/v1/chat/completions",
                            {"model": "m", "messages": [{"role": "user", "content": "hi"}]})


def test_anthropic_line_becomes_a_chat_body() -> None:
    line = {"custom_id": "c1", "params": {
        "model": "claude", "max_tokens": 50, "system": "be brief",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]}}
    [entry] = parse(json.dumps(line).encode())
    assert isinstance(entry, Request)
    assert entry.custom_id == "c1" and entry.url == "/v1/chat/completions"
    assert entry.body == {"model": "claude", "max_tokens": 50, "messages": [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}],
        "_anthropic_params": line["params"]}  # kept as written, for anthropic deployments


def test_shorthand_lines_default_custom_id_to_line_number() -> None:
    entries = parse(b'{"prompt": "one"}\n\n{"messages": [{"role": "user", "content": "two"}],'
                    b' "model": "m", "max_tokens": 5}\n')
    assert [e.custom_id for e in entries] == ["1", "3"]
    assert entries[0].body == {"messages": [{"role": "user", "content": "one"}]}
    assert entries[1].body["max_tokens"] == 5


@pytest.mark.parametrize(("raw", "reason"), [
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "must be a JSON object"),
    (b"\xff\xfe{}", "not valid UTF-8"),
    (json.dumps(openai_line(method="GET")).encode(), 'method must be "POST"'),
    (json.dumps(openai_line(url="/v1/images")).encode(), "url must be one of"),
    (json.dumps(openai_line(body="text")).encode(), "body must be a JSON object"),
    (json.dumps(openai_line(custom_id="")).encode(), "custom_id must be a non-empty string"),
    (json.dumps(openai_line(custom_id=7)).encode(), "custom_id must be a non-empty string"),
    (json.dumps(openai_line(body={"model": "m", "messages": []})).encode(),
     "messages must be a non-empty list"),
    (json.dumps(openai_line(body={"messages": [{"role": "user", "content": "x"}],
                                  "max_tokens": -1})).encode(),
     "max_tokens must be a positive integer"),
    (b'{"hello": "world"}', "unknown line format"),
    (b'{"custom_id": "x", "params": {"messages": [{"role": "user", "content": "x"}]}}',
     "params.max_tokens"),
])
def test_bad_line_names_its_line_and_reason(raw: bytes, reason: str) -> None:
    entries = parse(json.dumps(openai_line("first")).encode() + b"\n" + raw + b"\n")
    assert isinstance(entries[0], Request)
    assert isinstance(entries[1], BadLine)
    assert entries[1].line_no == 2
    assert reason in entries[1].reason


def test_oversized_line_is_refused_without_reading_it_whole() -> None:
    huge = json.dumps(openai_line("big", body={"messages": [
        {"role": "user", "content": "x" * (LIMIT * 10)}]})).encode()
    entries = parse(huge + b"\n" + json.dumps(openai_line("after")).encode())
    assert isinstance(entries[0], BadLine) and entries[0].line_no == 1
    assert f"longer than the limit of {LIMIT} bytes" in entries[0].reason
    assert isinstance(entries[1], Request) and entries[1].line_no == 2


def test_bad_line_keeps_its_custom_id_when_it_has_one() -> None:
    [entry] = parse(json.dumps(openai_line("keep", method="PUT")).encode())
    assert isinstance(entry, BadLine) and entry.custom_id == "keep"


def test_output_line_has_openai_batch_shape() -> None:
    line = output_line("batch_req_1", "a", 200, {"choices": []}, None)
    assert line == {"id": "batch_req_1", "custom_id": "a", "error": None,
                    "response": {"status_code": 200, "request_id": "batch_req_1",
                                 "body": {"choices": []}}}
    assert output_line("batch_req_2", "b", None, None, {"code": "x"})["response"] is None


@pytest.mark.parametrize("name", HOSTILE_LINES)
def test_a_hostile_line_is_refused_alone(name: str) -> None:
    line, reason, custom_id = HOSTILE_LINES[name]
    good = json.dumps(openai_line("before")).encode()
    entries = list(parse_stream(io.BytesIO(good + b"\n" + line.encode() + b"\n"
                                           + good.replace(b"before", b"after")), 1 << 20))
    assert [type(e) for e in entries] == [Request, BadLine, Request]
    assert entries[1].line_no == 2 and reason in entries[1].reason
    assert entries[1].custom_id == custom_id


def nested(levels: int) -> bytes:
    """A line whose containers nest `levels` deep, the line's own object included."""
    inner = "[" * (levels - 2) + "]" * (levels - 2)  # in the line's object, in its body
    return json.dumps(openai_line(body={"model": "m", "x": "X", "messages": [
        {"role": "user", "content": "hi"}]})).replace('"X"', inner).encode()


def test_depth_and_digits_are_refused_just_past_their_limits() -> None:
    deepest, too_deep = parse(nested(MAX_DEPTH) + b"\n" + nested(MAX_DEPTH + 1))
    assert isinstance(deepest, Request)
    assert isinstance(too_deep, BadLine) and "more than 64 levels" in too_deep.reason
    longest = int("7" * MAX_INTEGER_DIGITS)
    kept, refused = parse(json.dumps(openai_line(body={
        "model": "m", "seed": longest, "messages": [{"role": "user", "content": "hi"}]}))
        .encode() + b"\n" + json.dumps(openai_line(body={"seed": -longest * 10})).encode())
    assert isinstance(kept, Request) and kept.body["seed"] == longest
    assert isinstance(refused, BadLine)
    assert f"integer of {MAX_INTEGER_DIGITS + 1} digits is out of range" in refused.reason


@pytest.mark.parametrize("block", [1, 2, 3, 4, 1 << 20])
def test_a_byte_order_mark_is_not_part_of_the_first_line(
        block: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jsonlines, "_BLOCK", block)
    line = json.dumps(openai_line("excel")).encode()
    entries = parse(jsonlines.BOM + line + b"\n" + line.replace(b"excel", b"second"))
    assert [(type(e), e.custom_id) for e in entries] == [(Request, "excel"), (Request, "second")]
    # only at the start of the file: a mark in the middle is the line's own bytes
    [_, later] = parse(line + b"\n" + jsonlines.BOM + line.replace(b"excel", b"second"))
    assert isinstance(later, BadLine) and "not valid JSON" in later.reason
