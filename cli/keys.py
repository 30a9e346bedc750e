"""`quotaflow keys`: make, list, rotate and revoke API keys, straight in the database.

Keys are an operator's chore, like `quotaflow db upgrade`: the commands need
QUOTAFLOW_DATABASE_URL, not an API key. A new key is printed once, on stdout
alone (so `KEY=$(quotaflow keys create --tenant t)` works); only its digest is stored.
A key reaches its tenant's jobs and files within its scope (read, submit, admin), its
expiry and its allowlists of models and deployments; `--operator` also lets it read what
spans every tenant (`quotaflow limits`, GET /limits), which a tenant's key must not see.
"""

from typing import TYPE_CHECKING

import click

from quotaflow.config import get_settings

if TYPE_CHECKING:
    from quotaflow.tenants.keys import NewKey

SCOPES = ("read", "submit", "admin")


@click.group()
def keys() -> None:
    """API keys and the tenants they act for."""

@keys.command("create")
@click.option("--tenant", required=True, help="Whose jobs and files the key reaches.")
@click.option("--max-enqueued-tokens", type=click.IntRange(1), default=None,
              help="Set the tenant's quota of prompt tokens in unfinished batches "
                   "(default: QUOTAFLOW_MAX_ENQUEUED_TOKENS).")
@click.option("--max-spend", type=click.FloatRange(min=0), default=None, metavar="AMOUNT",
              help="Set what the tenant may spend per calendar month (UTC), in the "
                   "deployments' currency (default: QUOTAFLOW_MAX_MONTHLY_SPEND).")
@click.option("--weight", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Set the tenant's weight in a shared deployment's budget against "
                   "other tenants' work (default 1: equal shares).")
@click.option("--rpm", type=click.IntRange(1), default=None, metavar="N",
              help="Cap the tenant's requests per minute inside each deployment's budget "
                   "(all its jobs together; the other tenants share the rest).")
@click.option("--tpm", type=click.IntRange(1), default=None, metavar="N",
              help="Cap the tenant's tokens per minute the same way (prompt estimate + "
                   "max_tokens, as the deployment's budget counts them).")
@click.option("--operator", is_flag=True,
              help="Also allow what shows every tenant's activity: each deployment's "
                   "live usage (`quotaflow limits`, GET /limits).")
@click.option("--scope", type=click.Choice(SCOPES), default="admin", show_default=True,
              help="read: GET only; submit: also create, cancel, retry and delete the "
                   "tenant's jobs, files and batches; admin: also webhooks and the audit log.")
@click.option("--expires-in", default=None, metavar="DURATION",
              help="The key stops working after this long: 30d, 12h, 15m, 45s "
                   "(default: never).")
@click.option("--models", default=None, metavar="LIST",
              help="Only these models (comma-separated, as the lines name them).")
@click.option("--deployments", default=None, metavar="LIST",
              help="Only lines whose route reaches these deployments alone (comma-separated).")
def create(tenant: str, max_enqueued_tokens: int | None, max_spend: float | None,
           weight: float | None, rpm: int | None, tpm: int | None, operator: bool, scope: str,
           expires_in: str | None, models: str | None, deployments: str | None) -> None:
    """Create a key for TENANT and print it (shown this once only)."""
    from quotaflow.db import translate_db_errors
    from quotaflow.runtime import Runtime
    from quotaflow.tenants import audit, grants
    from quotaflow.tenants import keys as auth

    rules = auth.KeyRules(grants.Scope.named(scope),
                          grants.parse_duration(expires_in, "--expires-in")
                          if expires_in is not None else None,
                          grants.names(models), grants.names(deployments))
    with translate_db_errors():
        key = auth.create_key(Runtime(get_settings()).sessions, tenant,
                              max_enqueued_tokens, operator=operator,
                              max_monthly_spend=max_spend, weight=weight, rules=rules,
                              actor=audit.OPERATOR_CLI, max_rpm=rpm, max_tpm=tpm)
    click.echo(key.secret)
    click.echo(f"key {key.id} for tenant {key.tenant}{_described(key)}: store it now, it is "
               "not shown again", err=True)


def _described(key: "NewKey") -> str:
    operator = " operator" if key.operator else ""
    until = f", expires {key.expires_at:%Y-%m-%d %H:%M:%S} UTC" if key.expires_at else ""
    return f" (scope {key.scope}{operator}{until})"


@keys.command("rotate")
@click.argument("key_id")
@click.option("--grace", default="1h", show_default=True, metavar="DURATION",
              help="How long the old key keeps working (0s: not at all).")
@click.option("--expires-in", default=None, metavar="DURATION",
              help="The new key's lifetime (default: the old key's, or never).")
def rotate(key_id: str, grace: str, expires_in: str | None) -> None:
    """Print a new key in place of KEY_ID (same tenant, scope and allowlists); KEY_ID
    keeps working until the grace period ends, then gets 401."""
    from quotaflow.db import translate_db_errors
    from quotaflow.runtime import Runtime
    from quotaflow.tenants import audit, grants
    from quotaflow.tenants import keys as auth

    lifetime = (grants.parse_duration(expires_in, "--expires-in")
                if expires_in is not None else None)
    with translate_db_errors():
        key = auth.rotate_key(Runtime(get_settings()).sessions, key_id,
                              grants.parse_duration(grace, "--grace"), lifetime,
                              actor=audit.OPERATOR_CLI)
    click.echo(key.secret)
    click.echo(f"key {key.id} for tenant {key.tenant}{_described(key)} replaces {key_id}, "
               f"which works for {grace} more: store the new key now, it is not shown again",
               err=True)


@keys.command("tenant")
@click.argument("tenant")
@click.option("--models", default=None, metavar="LIST",
              help="Every key of the tenant may use only these models (comma-separated).")
@click.option("--deployments", default=None, metavar="LIST",
              help="... and only routes that reach these deployments alone.")
@click.option("--any", "clear", is_flag=True, help="Remove the tenant's lists first.")
@click.option("--rpm", type=click.IntRange(1), default=None, metavar="N",
              help="Cap the tenant's requests per minute inside each deployment's budget.")
@click.option("--tpm", type=click.IntRange(1), default=None, metavar="N",
              help="Cap the tenant's tokens per minute inside each deployment's budget.")
@click.option("--no-caps", is_flag=True, help="Remove the tenant's caps first.")
def tenant_lists(tenant: str, models: str | None, deployments: str | None,
                 clear: bool, rpm: int | None, tpm: int | None, no_caps: bool) -> None:
    """Limit every key of TENANT to models and deployments (beside each key's own lists:
    a line must be allowed by both), and cap its jobs' requests and tokens per minute
    inside each deployment's budget (new jobs get a change)."""
    from quotaflow.db import translate_db_errors
    from quotaflow.runtime import Runtime
    from quotaflow.tenants import audit, grants
    from quotaflow.tenants import keys as auth

    sessions = Runtime(get_settings()).sessions
    with translate_db_errors():
        auth.set_tenant_allowlist(sessions, tenant, grants.names(models),
                                  grants.names(deployments), clear, actor=audit.OPERATOR_CLI)
        if rpm is not None or tpm is not None or no_caps:
            auth.set_tenant_caps(sessions, tenant, rpm, tpm, no_caps, actor=audit.OPERATOR_CLI)
    unset = "none" if no_caps else "unchanged"
    click.echo(f"tenant {tenant}: models {models or ('any' if clear else 'unchanged')}, "
               f"deployments {deployments or ('any' if clear else 'unchanged')}, "
               f"rpm cap {rpm or unset}, tpm cap {tpm or unset}")


@keys.command("list")
def list_keys() -> None:
    """Key ids, tenants, scopes, expiry, last use, allowlists, and whether they are
    revoked (never the keys themselves)."""
    from quotaflow.db import translate_db_errors
    from quotaflow.models import utcnow
    from quotaflow.runtime import Runtime
    from quotaflow.tenants import keys as auth

    now = utcnow()
    with translate_db_errors(), Runtime(get_settings()).sessions() as session:
        for row in auth.list_keys(session):
            state = f"revoked {row.revoked_at:%Y-%m-%d}" if row.revoked_at else "active"
            if row.revoked_at is None and row.expires_at is not None:
                ended = row.expires_at <= now
                state = (f"{'expired' if ended else 'expires'} "
                         f"{row.expires_at:%Y-%m-%d %H:%M}")
            if row.replaced_by:
                state += f" (rotated to {row.replaced_by})"
            used = f"used {row.last_used_at:%Y-%m-%d %H:%M}" if row.last_used_at else "unused"
            extra = "".join(f"  {name} {','.join(value)}" for name, value in (
                ("models", row.allowed_models), ("deployments", row.allowed_deployments))
                if value is not None)
            operator = "  operator" if row.operator else ""
            click.echo(f"{row.id}  {row.tenant}  {row.scope}  created "
                       f"{row.created_at:%Y-%m-%d}  {state}  {used}{operator}{extra}")

@keys.command("revoke")
@click.argument("key_id")
def revoke(key_id: str) -> None:
    """Revoke a key by its id: requests with it get 401 from now on."""
    from quotaflow.db import translate_db_errors
    from quotaflow.runtime import Runtime
    from quotaflow.tenants import audit
    from quotaflow.tenants import keys as auth

    with translate_db_errors():
        auth.revoke_key(Runtime(get_settings()).sessions, key_id, actor=audit.OPERATOR_CLI)
    click.echo(f"{key_id} revoked")


def register(cli: click.Group) -> None:
    """Add this module's commands to the `quotaflow` group."""
    for command in (keys,):
        cli.add_command(command)
