"""`quotaflow audit`: who created, cancelled, retried or deleted what, via the API.

It needs an admin key (QUOTAFLOW_API_KEY): an operator's shows every tenant's events
(or one tenant's, `--tenant`), any other its own tenant's.
"""

import json
from datetime import UTC, datetime

import click

from cli.common import client


@click.command("audit")
@click.option("--tenant", default=None, help="Only this tenant's events (operator keys).")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 1000))
@click.option("--json", "as_json", is_flag=True, help="Print the events as JSON.")
def audit(tenant: str | None, limit: int, as_json: bool) -> None:
    """The newest actions first: time, tenant, key, action, object and client address."""
    events = client().audit_events(tenant, limit)
    if as_json:
        click.echo(json.dumps(events, indent=2))
        return
    for event in events:
        when = datetime.fromtimestamp(event["at"], UTC).strftime("%Y-%m-%d %H:%M:%S")
        click.echo(f"{when}  {event['tenant']}  {event['key_id'] or '(cli)'}  "
                   f"{event['action']} {event['object_type']} {event['object_id']}  "
                   f"from {event['client'] or '-'}")


def register(cli: click.Group) -> None:
    """Add this module's command to the `quotaflow` group."""
    cli.add_command(audit)
