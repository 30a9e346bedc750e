"""Each endpoint's signing secret, and the Standard Webhooks headers signed with it.

Secrets come only from the environment and are never stored, logged or echoed: an
endpoint's secret is HMAC-SHA256(QUOTAFLOW_WEBHOOK_SECRET_KEY, endpoint id), so the API
can show it once at creation and any worker can sign with it later, with nothing in the
database to leak. Changing the master key changes every endpoint's secret.
"""

import base64
import hashlib
import hmac
from datetime import datetime

from pydantic import SecretStr
from standardwebhooks import Webhook

from quotaflow.errors import NotConfigured

SECRET_PREFIX = "whsec_"
MIN_KEY_CHARS = 32


def master_key(key: SecretStr | None) -> bytes:
    """The master key's bytes, or an error saying how to set it."""
    if key is None or not key.get_secret_value():
        raise NotConfigured(
            "webhooks are off on this server: its operator must set "
            "QUOTAFLOW_WEBHOOK_SECRET_KEY (32 or more random characters, e.g. `openssl rand "
            "-hex 32`) for the API and the workers; endpoint secrets are derived from it")
    if len(key.get_secret_value()) < MIN_KEY_CHARS:
        # Checked here, not by pydantic, whose error would quote the value.
        raise NotConfigured(f"QUOTAFLOW_WEBHOOK_SECRET_KEY is too short: use {MIN_KEY_CHARS} "
                            "or more random characters, e.g. `openssl rand -hex 32`")
    return key.get_secret_value().encode()


def endpoint_secret(key: SecretStr | None, endpoint_id: str) -> str:
    """`whsec_` and the base64 of HMAC-SHA256(master key, endpoint id): what a receiver
    gives `standardwebhooks.Webhook` to verify this endpoint's events."""
    digest = hmac.new(master_key(key), endpoint_id.encode(), hashlib.sha256).digest()
    return SECRET_PREFIX + base64.b64encode(digest).decode()


def signed_headers(secret: str, message_id: str, body: str, at: datetime) -> dict[str, str]:
    """`webhook-id`, `webhook-timestamp` and `webhook-signature` for one attempt: the
    timestamp is the attempt's own (receivers refuse ones over 5 minutes old), the id the
    delivery's, the same on every attempt."""
    signature = Webhook(secret).sign(msg_id=message_id, timestamp=at, data=body)
    return {"webhook-id": message_id, "webhook-timestamp": str(int(at.timestamp())),
            "webhook-signature": signature, "content-type": "application/json"}
