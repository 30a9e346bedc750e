"""Who is looking at the console: the API key kept in its cookie, and the CSRF token
its forms carry.

The key is the whole credential, so it lives only in an HttpOnly cookie (no script
reads it) sent SameSite=Strict (no other site's page or link sends it), Secure when the
console is served over HTTPS. Every POST also carries a token derived from the key
(SHA-256 under a fixed label): a page of another origin can neither read it nor compute
it, and the request's Origin, where the browser sends one, must be the console's own.
With QUOTAFLOW_AUTH=off (development) a random value stands for the key.
"""

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from fastapi import Request, Response
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.config import Settings
from quotaflow.constants import DEFAULT_TENANT
from quotaflow.errors import AuthenticationError, QuotaflowError
from quotaflow.tenants.grants import Grant, Scope
from quotaflow.tenants.keys import key_grant

COOKIE = "quotaflow_console"
CSRF_FIELD = "csrf_token"
DEV_PREFIX = "dev:"


class SignInRequired(QuotaflowError):
    """No valid key in the cookie: the console answers with its sign-in page."""


class CsrfRefused(QuotaflowError):
    """A POST without the page's token, or from another origin."""


@dataclass(frozen=True)
class Viewer:
    tenant: str
    operator: bool
    cookie: str  # the key (or, auth off, a random stand-in): what the CSRF token binds to
    scope: Scope = Scope.ADMIN
    key_id: str = "none"

    def require(self, needed: Scope, action: str) -> None:
        """ScopeDenied (403) where the key's scope is below what `action` needs."""
        Grant(self.key_id, self.tenant, self.operator, self.scope).require(needed, action)

    @property
    def csrf(self) -> str:
        return csrf_token(self.cookie)


def csrf_token(cookie: str) -> str:
    return hashlib.sha256(b"quotaflow-console-csrf:" + cookie.encode()).hexdigest()


def identify(sessions: sessionmaker[Session], settings: Settings, key: str | None) -> Viewer:
    """The viewer a key stands for; SignInRequired for none, an unknown or an expired one."""
    if not settings.auth:
        if not key:
            raise SignInRequired("sign in")
        return Viewer(DEFAULT_TENANT, True, key)
    if not key or key.startswith(DEV_PREFIX):
        raise SignInRequired("sign in with an API key")
    with sessions() as session:
        try:
            grant = key_grant(session, key)
        except AuthenticationError as exc:
            raise SignInRequired(str(exc)) from exc
    return Viewer(grant.tenant, grant.operator, key, grant.scope, grant.key_id)


def sign_in_value(settings: Settings, key: str) -> str:
    """What the cookie keeps: the key, or with auth off a random stand-in for one."""
    return key if settings.auth else DEV_PREFIX + secrets.token_urlsafe(24)


def set_cookie(response: Response, request: Request, value: str) -> None:
    response.set_cookie(COOKIE, value, httponly=True, samesite="strict", path="/console",
                        secure=request.url.scheme == "https", max_age=12 * 3600)


def clear_cookie(response: Response) -> None:
    response.delete_cookie(COOKIE, path="/console", httponly=True, samesite="strict")


def check_post(request: Request, viewer: Viewer, token: str | None) -> None:
    """A form POST is the console's own: same origin, and the token of the viewer's key."""
    origin = request.headers.get("origin")
    own = f"{request.url.scheme}://{request.url.netloc}"
    if origin is not None and origin != own:
        raise CsrfRefused(f"a form from {origin} may not act on this console")
    if not token or not hmac.compare_digest(token, viewer.csrf):
        raise CsrfRefused("the form's token is missing or stale: reload the page and try again")
