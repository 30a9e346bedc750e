"""Entity tags of the status reads (`GET /jobs/{id}`, `/v1/batches/{id}`,
`/v1/messages/batches/{id}`), so a client that polls pays for a changed object only.

The tag is a strong validator of the bytes sent: a short hash of the object's JSON, as
the route renders it. `If-None-Match` is compared weakly (RFC 9110 13.1.2): `*`, a list
of tags, and `W/` tags all count, and a match is answered 304 with the tag and no body.
"""

import hashlib
from typing import Annotated, Any, cast

from fastapi import Header
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse, Response

IfNoneMatch = Annotated[str | None, Header(
    alias="If-None-Match", max_length=4096,
    description="An `ETag` from an earlier answer (or a list of them, or `*`): the same "
                "object is answered 304 Not Modified, with no body")]
NOT_MODIFIED: dict[int | str, dict[str, Any]] = {
    304: {"description": "Not Modified: the object's `ETag` matches `If-None-Match` (no body)"}}


def render(content: Any) -> bytes:
    """The object's JSON exactly as FastAPI would send it for a route returning it."""
    return cast(bytes, JSONResponse(jsonable_encoder(content)).body)


def tag_of(body: bytes) -> str:
    """A strong ETag (quoted) of a rendered body: 16 hex digits of its SHA-256."""
    return f'"{hashlib.sha256(body).hexdigest()[:16]}"'


def matches(if_none_match: str | None, etag: str) -> bool:
    """Whether `If-None-Match` names `etag`, compared weakly (the `W/` prefix ignored)."""
    if not if_none_match:
        return False
    if if_none_match.strip() == "*":
        return True
    return _opaque(etag) in {_opaque(tag) for tag in if_none_match.split(",")}


def _opaque(tag: str) -> str:
    tag = tag.strip()
    return tag[2:] if tag.startswith("W/") else tag


def not_modified(etag: str) -> Response:
    return Response(status_code=304, headers={"ETag": etag})


def answer(content: Any, if_none_match: str | None) -> Response:
    """The object with its `ETag`, or 304 when the client already holds it."""
    body = render(content)
    return tagged_body(body, tag_of(body), if_none_match)


def tagged_body(body: bytes, etag: str, if_none_match: str | None) -> Response:
    """A rendered object with its `ETag`, or 304 when the client already holds it."""
    if matches(if_none_match, etag):
        return not_modified(etag)
    return Response(body, media_type="application/json", headers={"ETag": etag})
