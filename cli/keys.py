"""`quotaflow keys`: make, list and revoke API keys, straight in the database.

Keys are an operator's chore, like `quotaflow db upgrade`: the commands need
QUOTAFLOW_DATABASE_URL, not an API key. A new key is printed once, on stdout
alone (so `KEY=$(quotaflow keys create --tenant t)` works); only its digest is stored.
A key reaches its tenant's jobs and files; `--operator` also lets it read what spans
every tenant (`quotaflow limits`, GET /limits), which a tenant's key must not see.
"""

import click

from quotaflow.config import get_settings


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
@click.option("--operator", is_flag=True,
              help="Also allow what shows every tenant's activity: each deployment's "
                   "live usage (`quotaflow limits`, GET /limits).")
def create(tenant: str, max_enqueued_tokens: int | None, max_spend: float | None,
           weight: float | None, operator: bool) -> None:
    """Create a key for TENANT and print it (shown this once only)."""
    from quotaflow.db import translate_db_errors
    from quotaflow.runtime import Runtime
    from quotaflow.tenants import keys as auth

    with translate_db_errors():
        key = auth.create_key(Runtime(get_settings()).sessions, tenant,
                              max_enqueued_tokens, operator=operator,
                              max_monthly_spend=max_spend, weight=weight)
    click.echo(key.secret)
    scope = " (operator)" if key.operator else ""
    click.echo(f"key {key.id} for tenant {key.tenant}{scope}: store it now, it is not "
               "shown again", err=True)

@keys.command("list")
def list_keys() -> None:
    """Key ids, tenants, operator keys, and whether they are revoked (never the keys
    themselves)."""
    from quotaflow.db import translate_db_errors
    from quotaflow.runtime import Runtime
    from quotaflow.tenants import keys as auth

    with translate_db_errors(), Runtime(get_settings()).sessions() as session:
        for row in auth.list_keys(session):
            state = f"revoked {row.revoked_at:%Y-%m-%d}" if row.revoked_at else "active"
            scope = "  operator" if row.operator else ""
            click.echo(f"{row.id}  {row.tenant}  created {row.created_at:%Y-%m-%d}  "
                       f"{state}{scope}")

@keys.command("revoke")
@click.argument("key_id")
def revoke(key_id: str) -> None:
    """Revoke a key by its id: requests with it get 401 from now on."""
    from quotaflow.db import translate_db_errors
    from quotaflow.runtime import Runtime
    from quotaflow.tenants import keys as auth

    with translate_db_errors():
        auth.revoke_key(Runtime(get_settings()).sessions, key_id)
    click.echo(f"{key_id} revoked")


def register(cli: click.Group) -> None:
    """Add this module's commands to the `quotaflow` group."""
    for command in (keys,):
        cli.add_command(command)
