"""AWS Signature Version 4 for Bedrock Runtime calls: botocore's signer and credentials.

botocore, not a signer of quotaflow's own: the canonical request (a path encoded twice,
the signed headers, the credential scope) is easy to get subtly wrong, and botocore's
credential chain is the one every AWS tool resolves the same way: the environment, the
shared config and credentials files with their profiles, SSO, web identity and the
container or instance role, temporary credentials refreshed before they expire.
Credentials are resolved when the provider is made (none found fails the line with a
configuration error then, not every call) and frozen at each call. Neither a key nor a
signature is ever logged or stored.

botocore is the optional extra `bedrock` (`pip install 'quotaflow[bedrock]'`); without
it a bedrock deployment fails its lines with a configuration error naming the extra.
"""

import logging
import os
from typing import Any
from urllib.parse import urlsplit

from quotaflow.deployments.deployment import Deployment
from quotaflow.errors import ConfigError

# The signing name of Bedrock Runtime (its endpoints are bedrock-runtime.REGION...).
SERVICE = "bedrock"
MISSING = ("provider 'bedrock' needs botocore (AWS's signer and credential chain): install "
           "quotaflow's `bedrock` extra, pip install 'quotaflow[bedrock]'")


def region_of(deployment: Deployment, session: Any = None) -> str:
    """The deployment's region, else the AWS configuration's; ConfigError when neither."""
    region = deployment.region
    if region is None and session is not None:
        region = session.get_config_variable("region")
    region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if not region:
        raise ConfigError(f"deployment {deployment.name!r} (provider bedrock) has no region: "
                          "set `region` in its table, or AWS_REGION")
    return region


def endpoint_url(deployment: Deployment, region: str | None) -> str:
    """`base_url`, else the region's Bedrock Runtime endpoint; ending in "/"."""
    base = deployment.base_url or f"https://bedrock-runtime.{region}.amazonaws.com"
    return base.rstrip("/") + "/"


class Signer:
    """Signs each POST to one Bedrock Runtime endpoint (`base_url`: the deployment's, or
    its region's) with the deployment's credentials."""

    def __init__(self, deployment: Deployment) -> None:
        try:
            import botocore.session
            from botocore.auth import SigV4Auth
            from botocore.awsrequest import AWSRequest
            from botocore.exceptions import BotoCoreError
        except ImportError as exc:
            raise ConfigError(f"deployment {deployment.name!r}: {MISSING}") from exc
        self._auth_class, self._request_class = SigV4Auth, AWSRequest
        # botocore.auth logs each canonical request at DEBUG, a session token among its
        # headers: never, whatever level a worker's root logger is set to.
        quiet = logging.getLogger("botocore.auth")
        quiet.setLevel(max(quiet.level, logging.INFO))
        try:
            session = botocore.session.Session(profile=deployment.aws_profile)
            self.region = region_of(deployment, session)
            credentials = session.get_credentials()
        except (BotoCoreError, ValueError) as exc:  # e.g. a profile the files do not have
            raise ConfigError(f"deployment {deployment.name!r}: AWS credentials: {exc}") from None
        if credentials is None:
            raise ConfigError(
                f"deployment {deployment.name!r} (provider bedrock) found no AWS credentials: "
                "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile (`aws_profile`), "
                "or run it where a role provides them")
        self._credentials = credentials
        self.base_url = endpoint_url(deployment, self.region)
        # The Host the connection pool sends (http1.py), signed as sent.
        self._host = urlsplit(self.base_url).netloc.rpartition("@")[2]

    def head(self, path: str, body: bytes) -> bytes:
        """The header lines (CRLF-ended) that sign a POST of `body` to base URL + `path`:
        Authorization, X-Amz-Date and, with temporary credentials, X-Amz-Security-Token.
        Host and Content-Type are signed with the values the connection sends."""
        request = self._request_class(
            method="POST", url=self.base_url + path, data=body,
            headers={"Host": self._host, "Content-Type": "application/json"})
        frozen = self._credentials.get_frozen_credentials()
        self._auth_class(frozen, SERVICE, self.region).add_auth(request)
        return "".join(f"{name}: {value}\r\n" for name, value in request.headers.items()
                       if name.lower() not in ("host", "content-type")).encode()
