"""The jobs console at /console: a tenant's jobs in the browser (docs/console.md).

`install` adds its routes, its static files (its own stylesheet and script: no CDN, no
build step) and its error pages: under /console an error is a page (the sign-in form,
"not found"), not the API's JSON; elsewhere the API's handler answers as before.
"""

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.datastructures import URL, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.console.routes import page, router
from api.console.session import CsrfRefused, SignInRequired
from quotaflow.errors import JobStateError, NotFound, PermissionDenied, QuotaflowError

PREFIX = "/console"
# The console's pages run no script but its own and load nothing from elsewhere; the
# plots are inline SVG, whose style attributes need 'unsafe-inline' for styles alone.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; "
                               "style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
                               "frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    # same-origin, not no-referrer: under no-referrer a form posts "Origin: null".
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
}


def install(app: FastAPI) -> None:
    app.include_router(router)
    app.mount(f"{PREFIX}/static", StaticFiles(directory=Path(__file__).parent / "static"),
              name="console-static")
    # quotaflow_error_handler (api/errors.py), a coroutine function.
    api_handler = cast(Callable[[Request, Exception], Awaitable[Response]],
                       app.exception_handlers[QuotaflowError])

    async def handler(request: Request, exc: Exception) -> Any:
        if not request.url.path.startswith(PREFIX):
            return await api_handler(request, exc)
        return _error_page(request, exc)

    app.add_exception_handler(QuotaflowError, handler)

    app.add_middleware(SecurityHeaders)


class SecurityHeaders:
    """The console's answers carry SECURITY_HEADERS and `Cache-Control: no-store` (where
    the route set none of its own); everything else passes untouched.

    A pure ASGI middleware rather than Starlette's BaseHTTPMiddleware (`@app.middleware`),
    which wrapped every request of the API in it: each piece of an upload's body went
    through a task group of its own, and each piece of a results stream through another
    task and queue (api/request_id.py says the same of its own)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not URL(scope=scope).path.startswith(PREFIX):
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in (*SECURITY_HEADERS.items(), ("Cache-Control", "no-store")):
                    headers.setdefault(name, value)
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _error_page(request: Request, exc: Exception) -> Response:
    if isinstance(exc, SignInRequired):
        if request.method == "GET" and "fragment" not in request.headers.get("x-console", ""):
            return RedirectResponse(f"{PREFIX}/login", status_code=303)
        return Response("signed out", status_code=401, media_type="text/plain")
    status, title = 400, "Not done"
    if isinstance(exc, NotFound):
        status, title = 404, "Not found"
    elif isinstance(exc, CsrfRefused | PermissionDenied):
        status, title = 403, "Refused"
    elif isinstance(exc, JobStateError):
        status, title = 409, "Not possible now"
    return page(request, "error.html", status_code=status, who=None, title=title,
                message=str(exc))
