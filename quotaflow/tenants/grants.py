"""What a key may do: its scope, how long it lives, and the models and deployments it may
send to.

A request's key is looked up once (quotaflow/tenants/keys.py, remembered for a few seconds by
quotaflow/tenants/key_cache.py) into a `Grant`; every check after that is arithmetic on it,
so a cached key costs no query. Scopes are ordered: `read` may only read (GET), `submit`
may also create, cancel, retry and delete its tenant's jobs, files and batches, `admin`
may also manage webhook endpoints and read the audit log. Keys made before scopes existed
are `admin` (migration 0024): they keep doing what they did.

An allowlist is the key's and its tenant's together: a line must be allowed by both. It
is checked at ingest, where the line is routed; a line whose route could reach a
deployment outside the list is refused rather than narrowed, so nothing decides later to
send it elsewhere.
"""

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import IntEnum

from quotaflow.deployments.catalog import Deployments
from quotaflow.errors import InvalidParameter, KeyExpired, ScopeDenied

_DURATION = re.compile(r"^\s*(\d+)\s*([smhd])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class Scope(IntEnum):
    """What a key may do; each scope may do everything the ones below it may."""

    READ = 1
    SUBMIT = 2
    ADMIN = 3

    @classmethod
    def named(cls, name: str) -> "Scope":
        try:
            return cls[name.upper()]
        except KeyError:
            raise InvalidParameter("scope", f"unknown scope {name!r}; choose read, submit "
                                            "or admin") from None

    @property
    def label(self) -> str:
        return self.name.lower()


def parse_duration(text: str, param: str = "expires_in") -> timedelta:
    """'30d', '12h', '15m' or '45s' as a timedelta; InvalidParameter for anything else."""
    found = _DURATION.match(text or "")
    if found is None:
        raise InvalidParameter(param, f"{param} {text!r} is not a duration: write a whole "
                                      "number and a unit, s, m, h or d (30d, 12h, 15m)")
    return timedelta(seconds=int(found.group(1)) * _UNIT_S[found.group(2)])


def names(text: str | None) -> tuple[str, ...] | None:
    """A comma-separated list as given on the command line; None for none given."""
    if text is None:
        return None
    return tuple(sorted({part.strip() for part in text.split(",") if part.strip()}))


@dataclass(frozen=True, slots=True)
class Allowlist:
    """The models and deployments a request may use; None: any."""

    models: frozenset[str] | None = None
    deployments: frozenset[str] | None = None

    @classmethod
    def of(cls, *lists: tuple[Iterable[str] | None, Iterable[str] | None]) -> "Allowlist":
        """The lists together: (models, deployments) pairs, each allowed by every one."""
        models: frozenset[str] | None = None
        deployments: frozenset[str] | None = None
        for own_models, own_deployments in lists:
            if own_models is not None:
                models = frozenset(own_models) if models is None else models & set(own_models)
            if own_deployments is not None:
                deployments = (frozenset(own_deployments) if deployments is None
                               else deployments & set(own_deployments))
        return cls(models, deployments)

    @property
    def limits(self) -> bool:
        return self.models is not None or self.deployments is not None

    def refusal(self, model: object, route: str, catalog: Deployments) -> str | None:
        """Why a line for `model`, routed to `route`, may not run; None when it may."""
        if self.models is not None and model not in self.models:
            return (f"model {model!r} is not allowed for this key (it may use "
                    f"{_listed(self.models)})")
        if self.deployments is not None:
            found = catalog.route_named(route)
            reach = found.names if found is not None else []
            outside = [name for name in reach if name not in self.deployments]
            if outside or not reach:
                return (f"model {model!r} is not allowed for this key: its route {route!r} "
                        f"reaches deployment(s) {', '.join(outside) or 'none'}, and the key "
                        f"may use only {_listed(self.deployments)}")
        return None


def _listed(allowed: frozenset[str]) -> str:
    return ", ".join(sorted(allowed)) or "no model"


@dataclass(frozen=True, slots=True)
class Grant:
    """One accepted key: whose, what it may do, until when (epoch seconds; None: no end)."""

    key_id: str
    tenant: str
    operator: bool
    scope: Scope
    expires_at: float | None = None
    allow: Allowlist = Allowlist()
    # The key that replaced it (`quotaflow keys rotate`): named when it is refused.
    replaced_by: str | None = None

    def check_live(self, now: float) -> None:
        """KeyExpired once the key's time is up (its own expiry or a rotation's grace)."""
        if self.expires_at is not None and now >= self.expires_at:
            raise expired(self.key_id, self.expires_at, self.replaced_by)

    def require(self, needed: Scope, action: str) -> None:
        """ScopeDenied when `action` needs more than the key's scope."""
        if self.scope < needed:
            raise ScopeDenied(
                f"this key (id {self.key_id}) has scope {self.scope.label!r}; {action} needs "
                f"scope {needed.label!r}: make a key with `quotaflow keys create --tenant "
                f"{self.tenant} --scope {needed.label}`", have=self.scope.label,
                needed=needed.label)


def expired(key_id: str, at: float, replaced_by: str | None) -> KeyExpired:
    when = datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    why = (f"was rotated (replaced by key {replaced_by}) and its grace period ended"
           if replaced_by else "expired")
    return KeyExpired(f"API key {key_id} {why} at {when}; use its replacement, or make a "
                      "new key with `quotaflow keys create` or `quotaflow keys rotate`")
