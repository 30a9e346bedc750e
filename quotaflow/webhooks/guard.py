"""Where a webhook may be sent: server-side request forgery guard.

An endpoint URL is the tenant's to choose, and the worker that POSTs to it sits inside
quotaflow's network: pointed at 127.0.0.1, 10.x or the cloud's metadata address
(169.254.169.254) it would reach quotaflow's own services or credentials. So a URL is
checked when it is registered and again at every attempt: http or https only, no
credentials in it, and every address its host resolves to must be public, unless it lies
in QUOTAFLOW_WEBHOOK_ALLOWED_NETWORKS. The sender then connects to the address checked
here, not to a second lookup's answer (DNS rebinding), and follows no redirects.
"""

import ipaddress
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast
from urllib.parse import SplitResult, urlsplit

from quotaflow.errors import InvalidParameter

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
MAX_URL_CHARS = 2048
SCHEMES = {"http": 80, "https": 443}


@dataclass(frozen=True)
class Target:
    """A checked URL: its parts, and the one address to connect to."""

    url: str
    scheme: str
    host: str
    port: int
    address: Address


class UnsafeUrl(InvalidParameter):
    """The URL is not one quotaflow sends webhooks to; the message says why."""

    def __init__(self, message: str) -> None:
        super().__init__("url", message)


def why_disallowed(address: Address) -> str | None:
    """Which kind of non-public address this is, or None for a public one."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    for kind, flag in (("loopback", address.is_loopback), ("unspecified", address.is_unspecified),
                       ("link-local", address.is_link_local), ("multicast", address.is_multicast),
                       ("private", address.is_private), ("reserved", address.is_reserved)):
        if flag:
            return kind
    if not address.is_global:  # shared (100.64.0.0/10), benchmarking, ...
        return "non-public"
    return None


def check_address(address: Address, allowed: Sequence[Network]) -> str | None:
    """What kind of address `address` is when it is refused ("a loopback address"), or
    None when it may be reached."""
    kind = why_disallowed(address)
    if kind is None or any(address in network for network in allowed):
        return None
    mapped = getattr(address, "ipv4_mapped", None)
    if mapped is not None and any(mapped in network for network in allowed):
        return None
    hint = " (a cloud metadata address)" if str(mapped or address) == "169.254.169.254" else ""
    article = "an" if kind[0] in "aeiou" else "a"
    return f"{article} {kind} address{hint}"


REFUSED = ("; webhooks are not sent to loopback, private, link-local, unspecified or multicast "
           "addresses unless the operator allows the network in "
           "QUOTAFLOW_WEBHOOK_ALLOWED_NETWORKS")


def parse_url(url: str) -> SplitResult:
    """The URL's parts, once its form is one quotaflow sends to (no lookup yet)."""
    if not isinstance(url, str) or not url:
        raise UnsafeUrl("url is empty; give an http:// or https:// URL")
    if len(url) > MAX_URL_CHARS:
        raise UnsafeUrl(f"url is longer than {MAX_URL_CHARS} characters")
    if not all("\x21" <= char <= "\x7e" for char in url):
        raise UnsafeUrl("url must be printable ASCII without spaces: percent-encode other "
                        "characters, and write an international domain name as punycode")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises for a port that is not a number in range)
    except ValueError as exc:
        raise UnsafeUrl(f"url {url!r} is not a valid URL: {exc}") from exc
    if parts.scheme.lower() not in SCHEMES:
        raise UnsafeUrl(f"url scheme {parts.scheme or '(none)'!r} is not allowed; use http:// "
                        "or https://")
    if not parts.hostname:
        raise UnsafeUrl(f"url {url!r} names no host")
    if parts.username is not None or parts.password is not None:
        raise UnsafeUrl("url must not contain a user name or password (it would be stored "
                        "and shown); authenticate the webhook by its signature instead")
    if parts.fragment:
        raise UnsafeUrl("url must not contain a #fragment")
    return parts


def resolve(url: str, allowed: Sequence[Network]) -> Target:
    """Check `url` and every address its host has; the address to connect to.

    Refused when any address is not allowed: a host with one public and one private
    address could be steered to the private one."""
    parts = parse_url(url)
    host = parts.hostname or ""
    port = parts.port or SCHEMES[parts.scheme.lower()]
    try:
        literal: Address | None = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is not None:
        addresses = [literal]
    else:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as exc:
            raise UnsafeUrl(f"url host {host!r} cannot be resolved ({exc}); check the name"
                            ) from exc
        addresses = list(dict.fromkeys(ipaddress.ip_address(cast(str, info[4][0]).split("%")[0])
                                       for info in infos))
        if not addresses:
            raise UnsafeUrl(f"url host {host!r} has no address")
    for address in addresses:
        kind = check_address(address, allowed)
        if kind is not None:
            what = (f"{address} is {kind}" if literal is not None
                    else f"host {host!r} resolves to {address}, {kind}")
            raise UnsafeUrl(f"url refused: {what}{REFUSED}")
    return Target(url=url, scheme=parts.scheme.lower(), host=host, port=port,
                  address=addresses[0])
