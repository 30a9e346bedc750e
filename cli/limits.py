"""`quotaflow limits`: each deployment's budget, level and utilisation, once or live."""

import time
from typing import Any

import click
from rich.live import Live
from rich.table import Table

from cli.common import client, print_json, stdout

LIMIT_COLUMNS = ("deployment", "model", "rpm", "tpm", "burst s", "refunds", "requests left",
                 "tokens left", "blocked s", "utilisation")


@click.command()
@click.option("--deployment", default=None, help="Only this deployment.")
@click.option("--watch", is_flag=True, help="Refresh every second until interrupted.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the API's limit objects as a JSON list (no --watch).")
def limits(deployment: str | None, watch: bool, as_json: bool) -> None:
    """Show each deployment's limits, current level and utilisation."""
    api = client()
    if as_json:
        print_json(api.limits(deployment))
    elif not watch:
        print_limits(limit_rows(api.limits(deployment)))
    else:
        with Live(limits_table(limit_rows(api.limits(deployment))), console=stdout,
                  auto_refresh=False) as live:
            while True:
                time.sleep(1.0)
                live.update(limits_table(limit_rows(api.limits(deployment))), refresh=True)


def register(cli: click.Group) -> None:
    """Add this module's commands to the `quotaflow` group."""
    for command in (limits,):
        cli.add_command(command)

def print_limits(rows: list[tuple[str, ...]]) -> None:
    """A table on a terminal; piped, plain columns nothing gets cut from."""
    if stdout.is_terminal:
        stdout.print(limits_table(rows))
        return
    widths = [max(len(row[i]) for row in [LIMIT_COLUMNS, *rows])
              for i in range(len(LIMIT_COLUMNS))]
    for row in [LIMIT_COLUMNS, *rows]:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))


def limit_rows(limits: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    return [(row["deployment"], row["model"], f"{row['rpm']:,}", f"{row['tpm']:,}",
             f"{row['burst_seconds']:g}", _refunds(row),
             f"{row['requests_available']:,.1f} / {row['request_capacity']:,.0f}",
             f"{row['tokens_available']:,.0f} / {row['token_capacity']:,.0f}",
             f"{row['blocked_for_s']:.1f}", f"{row['utilisation']:.0%}") for row in limits]


def _refunds(row: dict[str, Any]) -> str:
    """Whether unused max_tokens are given back: forced, or learned from the headers."""
    given = "yes" if row.get("refunds_unused_tokens") else "no"
    return f"{given} (learned)" if row.get("reconcile_usage") == "auto" else given


def limits_table(rows: list[tuple[str, ...]]) -> Table:
    table = Table(*LIMIT_COLUMNS)
    for row in rows:
        table.add_row(*row)
    return table
