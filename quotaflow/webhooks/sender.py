"""One delivery attempt: a signed POST to the address the guard checked.

The URL is checked again at every attempt (its host may resolve elsewhere since it was
registered) and the request goes to the checked address itself, with the URL's host in
the Host header and, for https, as the TLS server name (which is also what the
certificate is verified against): a second DNS answer never decides where it goes.
Redirects are not followed, and the answer's body is never read.
"""

import time

import httpx

from quotaflow import __version__
from quotaflow.config import Settings
from quotaflow.errors import QuotaflowError
from quotaflow.models import utcnow
from quotaflow.webhooks import guard, signing
from quotaflow.webhooks.outbox import Claim, Outcome

USER_AGENT = f"quotaflow-webhooks/{__version__}"


def make_client(settings: Settings) -> httpx.Client:
    """The delivery loop's client: no redirects, no proxies from the environment (a proxy
    would make its own lookup of the host), the attempt's timeout."""
    return httpx.Client(timeout=settings.webhook_timeout_s, follow_redirects=False,
                        trust_env=False)


def attempt(client: httpx.Client, settings: Settings, claim: Claim) -> Outcome:
    """POST the delivery's body once; what came of it. Never raises for the endpoint's
    failures: they are the attempt's outcome."""
    started = time.monotonic()

    def outcome(status: int | None, error: str | None) -> Outcome:
        return Outcome(status, error, int((time.monotonic() - started) * 1000))

    try:
        target = guard.resolve(claim.url, settings.webhook_allowed_networks)
        secret = signing.endpoint_secret(settings.webhook_secret_key, claim.endpoint_id)
    except QuotaflowError as exc:
        return outcome(None, str(exc))
    url = httpx.URL(claim.url)
    headers = signing.signed_headers(secret, claim.id, claim.body, utcnow())
    headers |= {"user-agent": USER_AGENT, "host": url.netloc.decode("ascii")}
    extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
    try:
        with client.stream("POST", url.copy_with(host=str(target.address)),
                           content=claim.body.encode(), headers=headers,
                           extensions=extensions) as response:
            status = response.status_code
    except httpx.TimeoutException:
        return outcome(None, f"no answer within {settings.webhook_timeout_s:g} s")
    except httpx.HTTPError as exc:
        return outcome(None, f"{exc.__class__.__name__}: {exc}" if str(exc)
                       else exc.__class__.__name__)
    if 300 <= status < 400:
        return outcome(status, "redirects are not followed; register the final URL")
    return outcome(status, None)
