"""The strict server's OAuth token endpoint, standing in for https://oauth2.googleapis.com/token.

A test writes a service-account key file whose `token_uri` points here
(QUOTAFLOW_MOCK_GOOGLE_SERVICE_ACCOUNT names it, so this server knows the key too);
google-auth's own service-account flow then signs a JWT with the private key and
trades it here for an access token, exactly as it would at Google. The assertion's
RS256 signature is checked with the key's public half, its issuer, audience and scope
too; the tokens issued are the only bearer tokens Vertex AI's routes accept.
"""

import json
import secrets
import time
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

GRANT = "urn:ietf:params:oauth:grant-type:jwt-bearer"
SCOPE = "https://www.googleapis.com/auth/cloud-platform"
LIFETIME_S = 3600
# The audience google-auth signs its assertions for, whatever the key file's token_uri.
GOOGLE_TOKEN_URI = "https://oauth2.googleapis.com/token"


class TokenIssuer:
    """Checks JWT-bearer grants from one service account and remembers the tokens issued."""

    def __init__(self, key_file: str | None) -> None:
        self.account: dict[str, Any] | None = None
        self.public_pem = b""
        if key_file:
            from cryptography.hazmat.primitives import serialization

            self.account = json.loads(Path(key_file).read_text())
            private = serialization.load_pem_private_key(
                self.account["private_key"].encode(), password=None)
            self.public_pem = private.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        self.tokens: dict[str, float] = {}  # token -> expiry (epoch seconds)
        self.grants = 0

    @property
    def project(self) -> str | None:
        return self.account.get("project_id") if self.account else None

    def valid(self, authorization: str) -> bool:
        token = authorization.removeprefix("Bearer ")
        return authorization.startswith("Bearer ") and self.tokens.get(token, 0) > time.time()

    async def token(self, request: Request) -> JSONResponse:
        form = await request.form()
        if self.account is None:
            return _error("invalid_client", "no service account is configured")
        if form.get("grant_type") != GRANT:
            return _error("unsupported_grant_type", f"grant_type {form.get('grant_type')!r}")
        problem = self._check(str(form.get("assertion", "")))
        if problem:
            return _error("invalid_grant", problem)
        token = f"ya29.mock-{secrets.token_urlsafe(24)}"
        self.tokens[token] = time.time() + LIFETIME_S
        self.grants += 1
        return JSONResponse({"access_token": token, "expires_in": LIFETIME_S,
                             "token_type": "Bearer"})

    def _check(self, assertion: str) -> str | None:
        from google.auth import exceptions, jwt

        assert self.account is not None
        try:
            claims = jwt.decode(assertion, certs=self.public_pem.decode(),
                                audience=[self.account["token_uri"], GOOGLE_TOKEN_URI])
        except (exceptions.GoogleAuthError, ValueError) as exc:
            return f"Invalid JWT Signature or claims: {exc}"
        if claims.get("iss") != self.account["client_email"]:
            return f"iss {claims.get('iss')!r} is not the service account"
        if SCOPE not in str(claims.get("scope", "")).split():
            return f"scope {claims.get('scope')!r} lacks {SCOPE}"
        return None


def _error(kind: str, description: str) -> JSONResponse:
    return JSONResponse({"error": kind, "error_description": description}, status_code=400)
