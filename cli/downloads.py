"""`quotaflow results` and `quotaflow errors`: a job's lines downloaded as they arrive,
with the lines received as progress, or joined to its input rows as a table."""

from typing import Any

import click

from cli.client import ApiClient
from cli.common import QUIET_OPTION, client
from cli.locations import INPUT, OUTPUT, open_output
from cli.progress import request_progress
from cli.tables import is_table, results_input, write_table
from quotaflow.tables import storage
from quotaflow.tables.storage import Location


@click.command()
@click.argument("job_id")
@click.option("-o", "--output", type=OUTPUT, default="-",
              help="Default: stdout; a .parquet or .csv file: the input table's rows with "
                   "their answers (docs/formats/tables.md); a path or an s3://, gs:// or "
                   "az:// URL (docs/formats/storage.md).")
@click.option("--input", "input_table", metavar="TABLE", type=INPUT,
              help="For a table out: the table the job was made from (default: the one "
                   "its metadata names, where it is on this machine).")
@click.option("--id-column", metavar="COLUMN",
              help="For a table out: the column that holds each row's custom_id (default: "
                   "the job's --id-column; custom_id for a JSONL file of requests).")
@QUIET_OPTION
def results(job_id: str, output: Location, input_table: Location | None,
            id_column: str | None, quiet: bool) -> None:
    """Download a job's result lines (in input order; partial while it runs)."""
    storage.check_location(output)
    api = client()
    job = api.get_job(job_id)
    if str(output) != "-" and is_table(output):
        table, kept_column = results_input(job, input_table, api.get_job, api.output_lines)
        id_column = id_column or kept_column
        with request_progress(quiet) as progress:
            task = progress.add_task(f"{job_id} rows", total=job["request_counts"]["total"],
                                     unit="rows")
            rows = write_table(output, table, id_column, api.output_lines(job_id, errors=False),
                               api.output_lines(job_id, errors=True),
                               on_rows=lambda done: progress.update(task, completed=done))
            progress.update(task, completed=rows)
        return
    _download(api, job, output, errors=False, quiet=quiet)


@click.command()
@click.argument("job_id")
@click.option("-o", "--output", type=OUTPUT, default="-",
              help="Default: stdout; a path or an s3://, gs:// or az:// URL.")
@QUIET_OPTION
def errors(job_id: str, output: Location, quiet: bool) -> None:
    """Download a job's error lines: invalid lines, failed and cancelled requests."""
    storage.check_location(output)
    api = client()
    _download(api, api.get_job(job_id), output, errors=True, quiet=quiet)


def _download(api: ApiClient, job: dict[str, Any], output: Location, errors: bool,
              quiet: bool) -> None:
    """The job's lines to OUTPUT as they arrive, with the lines received as progress
    (out of the lines ended so far: results are partial while a job runs)."""
    counts = job["request_counts"]
    expected = counts["failed"] if errors else counts["completed"]
    received = 0
    with open_output(output) as out, request_progress(quiet) as progress:
        task = progress.add_task(f"{job['id']} {'errors' if errors else 'results'}",
                                 total=expected, unit="lines")
        for chunk in api.stream_lines(job["id"], errors=errors):
            out.write(chunk)
            received += chunk.count(b"\n")
            progress.update(task, completed=received)


def register(cli: click.Group) -> None:
    """Add this module's commands to the `quotaflow` group."""
    for command in (results, errors):
        cli.add_command(command)
