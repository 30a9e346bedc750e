"""The lean HTTP/1.1 client's answer parser: whole answers only, keep-alive only when
the server allows it, chunked bodies joined, and malformed answers refused."""

import pytest

from quotaflow.providers.http1 import Http1Error, _parse


def test_content_length_answer_waits_for_its_body() -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Request-Id: r1\r\n\r\n"
    assert _parse(bytearray(head + b"he"), eof=False) is None
    answer, keep = _parse(bytearray(head + b"hello"), eof=False)
    assert (answer.status, answer.reason, answer.body, keep) == (200, "OK", b"hello", True)
    assert answer.headers["x-request-id"] == "r1"


def test_chunked_body_is_joined_once_the_last_chunk_is_in() -> None:
    head = b"HTTP/1.1 429 Too Many Requests\r\nTransfer-Encoding: chunked\r\n\r\n"
    body = b"3\r\nabc\r\n2;ext=1\r\nde\r\n0\r\n"
    assert _parse(bytearray(head + body), eof=False) is None
    answer, keep = _parse(bytearray(head + body + b"\r\n"), eof=False)
    assert (answer.status, answer.body, keep) == (429, b"abcde", True)


def test_connection_close_and_http10_are_not_reused() -> None:
    closing = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    assert _parse(bytearray(closing), eof=False)[1] is False
    old = b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok"
    assert _parse(bytearray(old), eof=False)[1] is False


def test_body_until_close_and_informational_answers() -> None:
    answer = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n\r\n{}"
    assert _parse(bytearray(answer), eof=False) is None
    parsed, keep = _parse(bytearray(answer), eof=True)
    assert (parsed.status, parsed.body, keep) == (200, b"{}", False)


@pytest.mark.parametrize("raw", [b"SSH-2.0-OpenSSH\r\n\r\n",
                                 b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
                                 b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"])
def test_malformed_answers_are_refused(raw: bytes) -> None:
    with pytest.raises(Http1Error):
        _parse(bytearray(raw), eof=False)
