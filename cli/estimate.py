"""`quotaflow estimate FILE`: tokens, cost and time of a file before it is submitted.

The file goes to the API (POST /jobs?dry_run=true, the upload `submit` makes), which
counts it with the deployments and the tenant's limits the cluster really has and
stores nothing; there is no offline path, so an estimate never disagrees with the
server it describes. This module only prints the answer: a summary for people, the
API's JSON object as is for scripts (`--json`).
"""

import json
from pathlib import Path
from typing import Any

import click

from quotaflow.config import get_settings
from quotaflow.constants import DEFAULT_QUEUE, QUEUES

COLUMNS = ("route", "deployments", "requests", "tokenizer", "prompt tokens",
           "max completion", "cost", "time", "binds")


def register(cli: click.Group) -> None:
    @cli.command()
    @click.argument("input_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
    @click.option("--queue", type=click.Choice(QUEUES), default=DEFAULT_QUEUE,
                  show_default=True, help="The queue it would run on (its floor slows it).")
    @click.option("--json", "as_json", is_flag=True,
                  help="Print the API's estimate object (docs/formats/estimate.md).")
    def estimate(input_file: Path, queue: str, as_json: bool) -> None:
        """Estimate INPUT_FILE's tokens, cost and time at the deployments' budgets, and
        its share of the tenant's limits, without submitting it (nothing is stored)."""
        from cli.main import client

        found = client(get_settings().submit_timeout_s).estimate(input_file, queue)
        click.echo(json.dumps(found, indent=2) if as_json else render(found))


def render(found: dict[str, Any]) -> str:
    """The estimate as a few lines and a table."""
    lines, totals = found["lines"], found["totals"]
    out = [f"lines     {lines['total']:,}: {lines['valid']:,} valid, {lines['invalid']:,} "
           f"invalid; queue {found['queue']}"]
    out += [f"  line {e['line']}: {e['message']}" for e in lines["errors"]]
    rows = [_route_row(route) for route in found["routes"]]
    rows.append(("total", "", f"{totals['requests']:,}", "", f"{totals['prompt_tokens']:,}",
                 f"{totals['max_completion_tokens']:,}", _cost(totals["cost"]),
                 duration(totals["seconds"]), ""))
    widths = [max(len(row[i]) for row in [COLUMNS, *rows]) for i in range(len(COLUMNS))]
    out.append("")
    out += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
            for row in [COLUMNS, *rows]]
    out += ["", f"time: at 100% of the deployments' RPM/TPM from full buckets; the limiter "
                f"admits by about characters / 4 + max_tokens "
                f"({totals['admission_prompt_tokens']:,} prompt tokens so counted)"]
    out += _tenant(found["tenant"])
    if found["submit_would_refuse"]:
        out.append("submit would refuse this file: " + "; ".join(found["submit_would_refuse"]))
    return "\n".join(out)


def _route_row(route: dict[str, Any]) -> tuple[str, ...]:
    time = route["time"]
    binds = "" if time is None else (
        f"{time['binding']} ({time['rpm']:,.0f} rpm, {time['tpm']:,.0f} tpm)")
    return (route["route"], ",".join(route["deployments"]), f"{route['requests']:,}",
            route["tokenizer"], f"{route['prompt_tokens']:,}",
            f"{route['max_completion_tokens']:,}", _cost(route["cost"]),
            "" if time is None else duration(time["seconds"]), binds)


def _cost(cost: dict[str, Any] | None) -> str:
    if cost is None:
        return "unknown (no prices)"
    text = f"{_money(cost['low'])} .. {_money(cost['high'])} {cost['currency']}"
    return text if cost.get("complete", True) else f"{text} + unknown"


def _money(amount: float) -> str:
    return f"{amount:,.2f}" if amount == 0 or amount >= 0.01 else f"{amount:.4f}"


def duration(seconds: float) -> str:
    """15.2 s, 3 min 05 s, 2 h 04 min."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    return f"{minutes // 60} h {minutes % 60:02d} min"


def _tenant(tenant: dict[str, Any]) -> list[str]:
    tokens, money = tenant["enqueued_tokens"], tenant["monthly_spend"]
    out = [f"tenant {tenant['name']}:"]
    if tokens is None:
        out.append("  enqueued tokens: no limit")
    else:
        out.append(f"  enqueued tokens: {tokens['this_file']:,} of the limit of "
                   f"{tokens['limit']:,} ({tokens['share_of_limit']:.1%}; unfinished "
                   f"batches hold {tokens['held']:,}){'' if tokens['fits'] else ' OVER'}")
    if money is None:
        out.append("  monthly spend: no limit")
    else:
        share = "" if money["share_of_left"] is None else f" ({money['share_of_left']:.1%})"
        unit = money["currency"]
        out.append(f"  monthly spend: up to {_money(money['this_file_high'])} {unit} of the "
                   f"{_money(money['left'])} {unit} left of {_money(money['limit'])} {unit}"
                   f"{share}"
                   f"{'' if money['fits'] else ' OVER'}")
    return out
