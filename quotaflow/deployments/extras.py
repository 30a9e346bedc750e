"""A deployment's own headers and query parameters: literal values, or `{ env = "NAME" }`.

A gateway's tenant header, `OpenAI-Organization`, an Azure Functions `code` parameter:
some of these are secrets, so a value may name the environment variable that holds it
instead of being written in the file. The inline table `{ env = "NAME" }` was chosen
over `"${NAME}"` interpolation: a literal value can never be mistaken for a reference
(a header that really contains `${...}` is sent as written), and the file says which
values are secrets. Environment values are read when the provider is made (a missing
one fails the deployment's lines with a configuration error then, naming the variable,
never its value) and again at each call, so a rotated secret takes effect without a
restart. Nothing here is logged, and errors name a variable, never its value.
"""

import os
from collections.abc import Mapping
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict, Field

from quotaflow.errors import ConfigError

# Headers quotaflow sets itself: a deployment may not replace them (the key's header
# comes from api_key_env, the framing from the body quotaflow sends).
RESERVED_HEADERS = frozenset({"host", "content-length", "content-type", "transfer-encoding",
                              "connection"})


class EnvValue(BaseModel):
    """A value read from the environment variable `env` at call time."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    env: str = Field(min_length=1, description="The environment variable holding the value.")


ExtraValue = str | EnvValue


def check_headers(headers: Mapping[str, ExtraValue]) -> None:
    """Header names HTTP allows, not ones quotaflow frames the request with; values that
    cannot break a header line. Raises ValueError naming the header."""
    for name, value in headers.items():
        if not name or not all(33 <= ord(c) < 127 and c not in '()<>@,;:\\"/[]?={} ' for c in name):
            raise ValueError(f"headers: {name!r} is not a valid header name")
        if name.lower() in RESERVED_HEADERS:
            raise ValueError(f"headers: {name!r} is set by quotaflow and cannot be replaced")
        if isinstance(value, str) and ("\r" in value or "\n" in value):
            raise ValueError(f"headers: the value of {name!r} holds a line break")


def resolve(values: Mapping[str, ExtraValue], deployment: str, what: str) -> dict[str, str]:
    """The values with each `{ env = NAME }` read from the environment now; ConfigError
    naming the variable (never a value) where one is unset or would break the request."""
    resolved = {}
    for name, value in values.items():
        if isinstance(value, str):
            resolved[name] = value
            continue
        found = os.environ.get(value.env)
        if not found:
            raise ConfigError(f"deployment {deployment!r} reads {what} {name!r} from "
                              f"${value.env}, which is not set")
        if "\r" in found or "\n" in found:
            raise ConfigError(f"deployment {deployment!r}: ${value.env} ({what} {name!r}) "
                              "holds a line break")
        resolved[name] = found
    return resolved


def header_lines(headers: Mapping[str, str]) -> bytes:
    """`Name: value\\r\\n` for each header, as the HTTP/1.1 client writes its head."""
    return "".join(f"{name}: {value}\r\n" for name, value in headers.items()).encode()


def query_string(query: Mapping[str, str]) -> str:
    """`a=1&b=x%20y`: names and values percent-encoded (RFC 3986 unreserved kept)."""
    return "&".join(f"{quote(name, safe='')}={quote(value, safe='')}"
                    for name, value in query.items())


def with_query(path: str, query: str) -> str:
    """`path` with `query` appended after its own parameters, if any."""
    if not query:
        return path
    return f"{path}{'&' if '?' in path else '?'}{query}"

