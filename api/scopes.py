"""Which scope each route needs, decided in one place from its method and path.

Reads (GET, HEAD) need `read`; everything else a key does to its tenant's jobs, files
and batches needs `submit`; managing webhook endpoints and reading the audit log need
`admin`. The rule is applied by the dependency every authenticated route already has
(api/deps.py), so a new route is covered without naming it anywhere.
"""

from quotaflow.tenants.grants import Scope

READS = frozenset({"GET", "HEAD", "OPTIONS"})
# Paths (and everything under them) that only an admin key may change.
ADMIN_WRITES = ("/webhooks",)
# Paths that only an admin key may even read.
ADMIN_READS = ("/audit",)


def _under(path: str, prefixes: tuple[str, ...]) -> bool:
    return any(path == prefix or path.startswith(prefix + "/") for prefix in prefixes)


def needed(method: str, path: str) -> Scope:
    """The scope a request of `method` on `path` needs."""
    if _under(path, ADMIN_READS):
        return Scope.ADMIN
    if method.upper() in READS:
        return Scope.READ
    return Scope.ADMIN if _under(path, ADMIN_WRITES) else Scope.SUBMIT
