"""`quotaflow webhooks`: a tenant's endpoints and what was delivered to them, via the API.

Like the job commands, these act for QUOTAFLOW_API_KEY's tenant. `add` prints the
endpoint's signing secret once (on stdout, the rest on stderr, so
`SECRET=$(quotaflow webhooks add URL)` works); nothing shows it again.
"""

import json
from datetime import UTC, datetime

import click

from cli.common import client

# The events, spelled out: the API commands start without importing the domain's database
# layer (quotaflow.webhooks.EVENT_TYPES holds the same four).
EVENTS = ("batch.completed", "batch.failed", "batch.expired", "batch.cancelled")


def _when(unix: float | None) -> str:
    return "-" if unix is None else datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%d %H:%M:%S")


@click.group()
def webhooks() -> None:
    """Endpoints that hear when your jobs end (Standard Webhooks, signed)."""

@webhooks.command("add")
@click.argument("url")
@click.option("--events", default=",".join(EVENTS), show_default=True,
              help="Comma-separated events to receive.")
def add(url: str, events: str) -> None:
    """Register URL; print its signing secret (shown this once only)."""
    names = [name.strip() for name in events.split(",") if name.strip()]
    endpoint = client().create_webhook(url, names)
    click.echo(endpoint["secret"])
    click.echo(f"endpoint {endpoint['id']} for {endpoint['url']} "
               f"({', '.join(endpoint['events'])}): store the secret now, it is not "
               "shown again", err=True)

@webhooks.command("list")
def list_endpoints() -> None:
    """Your endpoints: id, URL and events (never their secrets)."""
    for endpoint in client().list_webhooks():
        click.echo(f"{endpoint['id']}  {endpoint['url']}  {','.join(endpoint['events'])}  "
                   f"created {_when(endpoint['created_at'])}")

@webhooks.command("remove")
@click.argument("endpoint_id")
def remove(endpoint_id: str) -> None:
    """Remove an endpoint; deliveries to it not yet made are dropped."""
    client().remove_webhook(endpoint_id)
    click.echo(f"{endpoint_id} removed")

@webhooks.command("deliveries")
@click.option("--endpoint", "endpoint_id", default=None, metavar="ID",
              help="Only this endpoint's deliveries.")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 100))
@click.option("--json", "as_json", is_flag=True, help="Print the deliveries as JSON.")
def deliveries(endpoint_id: str | None, limit: int, as_json: bool) -> None:
    """The newest deliveries, each with every attempt: when, status code or error, ms."""
    rows = client().webhook_deliveries(endpoint_id, limit)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for row in rows:
        click.echo(f"{row['id']}  {row['type']:<15}  {row['job_id']}  {row['status']:<9}  "
                   f"endpoint {row['endpoint_id']}  {len(row['attempts'])} attempts")
        for attempt in row["attempts"]:
            answer = attempt["status_code"] or attempt["error"]
            click.echo(f"    #{attempt['attempt']}  {_when(attempt['attempted_at'])}  "
                       f"{answer}  {attempt['duration_ms']} ms")


def register(cli: click.Group) -> None:
    """Add this module's commands to the `quotaflow` group."""
    for command in (webhooks,):
        cli.add_command(command)
