"""`x-request-id` on every answer, as OpenAI's API sends it: a client quotes it in a bug
report and the operator finds the request in the log (api/errors.py logs it with a 500).

A pure ASGI middleware rather than Starlette's BaseHTTPMiddleware, which would wrap
every response (streams of results included) in another task and queue.
"""

import uuid

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = "x-request-id"


def new_request_id() -> str:
    return f"req_{uuid.uuid4().hex}"


class RequestIdMiddleware:
    """Gives each HTTP request an id, kept in `request.state.request_id` and sent back."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = new_request_id()
        # The same dict is the scope of the error handlers outside this middleware.
        scope.setdefault("state", {})["request_id"] = request_id

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                if HEADER not in headers:
                    headers.append(HEADER, request_id)
            await send(message)

        await self.app(scope, receive, send_with_id)
