"""`quotaflow estimate FILE`: tokens, cost and time of a file before it is submitted.

With an API configured (QUOTAFLOW_API_URL set), the file goes to it (POST
/jobs?dry_run=true, the upload `submit` makes), which counts it with the deployments and
the tenant's limits the cluster really has and stores nothing. With none, it is counted
here from the deployments file, as `quotaflow run` would run it: the same pass and the
same arithmetic (quotaflow/ingest/estimate.py), with the tenant's limits "not checked" (they
live in the cluster's database). `--offline` counts here even with an API configured.
This module prints the answer: a summary for people, the estimate object for scripts
(`--json`); it exits 2 when submit would refuse the file.
"""

import json
import sys
from pathlib import Path
from typing import Any

import click

from cli import exit_codes
from quotaflow.config import Settings, get_settings
from quotaflow.constants import DEFAULT_QUEUE, QUEUES

COLUMNS = ("route", "deployments", "requests", "tokenizer", "prompt tokens",
           "max completion", "cost", "time", "binds")


@click.command()
@click.argument("input_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--queue", type=click.Choice(QUEUES), default=DEFAULT_QUEUE,
              show_default=True, help="The queue it would run on (its floor slows it).")
@click.option("--json", "as_json", is_flag=True,
              help="Print the estimate object (docs/formats/estimate.md).")
@click.option("--offline", is_flag=True,
              help="Count here from the deployments file even when QUOTAFLOW_API_URL is "
                   "set (tenant limits not checked).")
@click.option("-q", "--quiet", is_flag=True,
              help="Print nothing: the exit status says whether submit would take it.")
def estimate(input_file: Path, queue: str, as_json: bool, offline: bool,
             quiet: bool) -> None:
    """Estimate INPUT_FILE's tokens, cost and time at the deployments' budgets, and
    its share of the tenant's limits, without submitting it (nothing is stored).

    Asks the API when QUOTAFLOW_API_URL is set; without one (or with --offline) it
    counts from the deployments file, as `quotaflow run` would run the file. Exits 2
    when submit would refuse the file."""
    settings = get_settings()
    if offline or not api_configured(settings):
        found = local_estimate(settings, input_file, queue)
    else:
        from cli.common import client

        found = client(settings.submit_timeout_s).estimate(input_file, queue)
    if as_json:
        click.echo(json.dumps(found, indent=2))
    elif not quiet:
        click.echo(render(found))
    sys.exit(exit_codes.INVALID_INPUT if found["submit_would_refuse"] else exit_codes.OK)


def register(cli: click.Group) -> None:
    """Add this module's commands to the `quotaflow` group."""
    for command in (estimate,):
        cli.add_command(command)

def api_configured(settings: Settings) -> bool:
    """Whether QUOTAFLOW_API_URL (or .env) names an API: the default URL is where `quotaflow
    api` would listen, not a statement that one runs."""
    return "api_url" in settings.model_fields_set


def local_estimate(settings: Settings, input_file: Path, queue: str) -> dict[str, Any]:
    """The estimate from the deployments file, read as `quotaflow run` reads it."""
    from quotaflow.ingest.estimate import offline_object, scan_file

    deployments = settings.load_deployments()
    with input_file.open("rb") as handle:
        return offline_object(scan_file(handle, settings, deployments, queue))


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


def _tenant(tenant: dict[str, Any] | None) -> list[str]:
    if tenant is None:
        return ["tenant limits: not checked (estimated here from the deployments file, "
                "with no API; set QUOTAFLOW_API_URL to have the cluster check them)"]
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
