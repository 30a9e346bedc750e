"""Who may read /metrics: anyone, or only a scraper holding QUOTAFLOW_METRICS_TOKEN.

The metrics name deployments and tenants (fair shares, spend) and show queue depths, so
an operator whose metrics port is reachable by others can require a bearer token, the
way Prometheus sends one (`authorization: {type: Bearer, credentials_file: ...}` in a
scrape config). One rule for the API's /metrics and every worker's (workers/metrics.py).
"""

import hmac

from pydantic import SecretStr

BEARER = "bearer "
CHALLENGE = 'Bearer realm="quotaflow metrics"'


def authorized(header: str | None, token: SecretStr | None) -> bool:
    """True when no token is configured, or the Authorization header carries it. Compared
    in constant time, so response timing tells nothing about the token."""
    if token is None:
        return True
    if not header or header[:len(BEARER)].lower() != BEARER:
        return False
    given = header[len(BEARER):].strip().encode()
    return hmac.compare_digest(given, token.get_secret_value().encode())
