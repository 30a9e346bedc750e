"""What the CLI's commands share: the API client from the settings, JSON and table
output, and the options several commands take."""

import json

import click
from rich.console import Console

from cli.client import ApiClient
from quotaflow.config import get_settings
from quotaflow.constants import DEFAULT_QUEUE, QUEUES

QUEUE_OPTION = click.option("--queue", type=click.Choice(QUEUES), default=DEFAULT_QUEUE,
                            show_default=True, help="Priority class of the job.")
stdout = Console(soft_wrap=True)
QUIET_OPTION = click.option("-q", "--quiet", is_flag=True,
                            help="No progress and no summary: errors only (the exit status "
                                 "says how it went; docs/operations/cli.md).")
JSON_OPTION = click.option("--json", "as_json", is_flag=True,
                           help="Print the job object as JSON (docs/formats/output.md).")


def print_json(value: object) -> None:
    click.echo(json.dumps(value, indent=2))


def client(submit_timeout: float | None = None) -> ApiClient:
    return ApiClient.from_settings(get_settings(), submit_timeout)


DEDUP_OPTION = click.option(
    "--dedup/--no-dedup", default=None,
    help="Share one answer between identical lines: --dedup every identical line, "
         "--no-dedup none (default: only lines whose answer cannot differ: temperature 0 "
         "without n or top_p sampling, embeddings, moderations).")


