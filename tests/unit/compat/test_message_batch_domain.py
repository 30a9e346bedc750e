"""Message Batches' create body as JSONL lines, with no server (quotaflow/
message_batch_body.py): each request one line of the bytes sent, and what Anthropic
refuses at creation named by its request. The objects, cursors and deleting on the real
PostgreSQL are tests/cluster/test_message_batch_domain.py's."""

import json

import pytest

from quotaflow.compat.anthropic_batch_body import BatchBodyError, open_requests


def body(*requests: object, **extra: object) -> bytes:
    return json.dumps({"requests": list(requests), **extra}).encode()


def req(custom_id: str, text: str = "hi", model: str = "gpt-4o-mini") -> dict:
    return {"custom_id": custom_id, "params": {"model": model, "max_tokens": 16,
                                               "messages": [{"role": "user", "content": text}]}}


def test_each_request_is_one_line_of_the_bytes_sent() -> None:
    # Pretty-printed JSON, UTF-8 text and escapes: each request's own bytes, one a line
    sent = json.dumps({"requests": [req("a", "h\u00e9 \u2603\n"), req("b")]}, indent=2,
                      ensure_ascii=False).encode()
    lines = open_requests(sent, 10).read().split(b"\n")
    assert lines[-1] == b"" and len(lines) == 3
    assert [json.loads(line) for line in lines[:2]] == [req("a", "h\u00e9 \u2603\n"), req("b")]
    assert "h\u00e9 \u2603".encode() in lines[0]  # not re-encoded as \\u escapes


@pytest.mark.parametrize(("sent", "reason"), [
    (b"", "ends at byte 0"),
    (b"[1]", "must be a JSON object"),
    (b"{}", "requests: Field required"),
    (b'{"requests": {}}', "requests: Input should be a valid list"),
    (b'{"requests": []}', "at least 1 item"),
    (body(req("a"), model="x"), "model: Extra inputs are not permitted"),
    (body(req("a")) + b"x", "extra data at byte"),
    (body(req("a"))[:-3], "not valid JSON"),
    (body(req("a"), req("b"), req("a")), "requests.2.custom_id: duplicate custom_id 'a' "
                                         "(also requests.0.custom_id)"),
    (body(req("a b")), "requests.0.custom_id: String should match pattern"),
    (body(req("x" * 65)), "requests.0.custom_id: String should match pattern"),
    (body({"custom_id": "a"}), "requests.0.params: Field required"),
    (body({"params": {}}), "requests.0.custom_id: Field required"),
    (body({"custom_id": "a", "params": "p"}), "requests.0.params: Input should be a valid"),
    (body({"custom_id": "a", "params": {}, "url": "/v1"}), "requests.0.url: Extra inputs"),
    (body(req("a"), 7), "requests.1: Input should be a valid dictionary"),
    (b'{"requests": ' + b"[" * 50_000, "requests.0: nested too deeply"),
    (body(*[req(f"r{i}") for i in range(4)]), "at most 3 requests"),
])
def test_what_anthropic_refuses_at_creation_names_the_request(sent: bytes, reason: str) -> None:
    with pytest.raises(BatchBodyError) as refused:
        open_requests(sent, 3).read()
    assert reason in str(refused.value)
