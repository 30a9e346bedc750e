"""`quotaflow`: every command a user runs, from the quick start to the cluster."""

import contextlib
import itertools
import logging
import os
import sys
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import click
import orjson

from cli import exit_codes
from cli.client import ApiClient
from cli.common import (
    DEDUP_OPTION,
    JSON_OPTION,
    QUEUE_OPTION,
    QUIET_OPTION,
    client,
    print_json,
)
from cli.exit_codes import FINAL
from cli.locations import INPUT, OUTPUT, open_output
from cli.progress import request_progress
from cli.tables import (
    TemplateChoice,
    check_input,
    is_table,
    merged_metadata,
    requests_for,
    template_options,
    write_table,
)
from quotaflow.config import get_settings
from quotaflow.deployments.pricing import money
from quotaflow.errors import QuotaflowError
from quotaflow.observe import logs
from quotaflow.tables import storage
from quotaflow.tables.storage import Location
from quotaflow_client.uploads import count_lines

if TYPE_CHECKING:
    from cli.embedded import OutputLines


@click.group()
@click.version_option(package_name="quotaflow")
def cli() -> None:
    """Batch LLM requests on one cluster-wide provider budget."""
    # Warnings and errors only (quotaflow run's retries, say); `quotaflow api` and the
    # workers log at INFO in the same format.
    logs.configure(get_settings(), logging.WARNING)


@cli.command()
@click.argument("input_file", type=INPUT, required=False)
@click.option("-o", "--output", type=OUTPUT, default="-",
              help="Where result lines go (default: standard output); a .parquet or .csv "
                   "file: the input's rows with their answers (docs/formats/tables.md); a "
                   "path or an s3://, gs:// or az:// URL (docs/formats/storage.md).")
@click.option("--errors", "errors_path", type=OUTPUT,
              help="Where error lines go (default: OUTPUT with .errors.jsonl).")
@QUEUE_OPTION
@click.option("--concurrency", default=4, show_default=True, type=click.IntRange(1, 256),
              help="Batches in flight at once.")
@click.option("--max-rpm", type=click.IntRange(1), metavar="N",
              help="Cap the job's requests per minute inside each deployment's budget.")
@click.option("--max-tpm", type=click.IntRange(1), metavar="N",
              help="Cap the job's tokens per minute (prompt estimate + max_tokens) the same "
                   "way.")
@DEDUP_OPTION
@QUIET_OPTION
@click.option("--json", "as_json", is_flag=True,
              help="Print the ended job object as JSON on standard output (needs -o FILE "
                   "for the results).")
@template_options
def run(input_file: Location | None, output: Location, errors_path: Location | None, queue: str,
        concurrency: int, max_rpm: int | None, max_tpm: int | None, dedup: bool | None,
        quiet: bool, as_json: bool, **shaping: Any) -> None:
    """Process INPUT_FILE in this process (no broker, no server) and write the results.

    INPUT_FILE is a JSONL file of requests, or with --template a table whose rows become
    requests (a path or an s3://, gs:// or az:// URL); with --after JOB instead, the rows
    are that earlier `run`'s results. Exits 0 when every line succeeded, 3 when some
    failed (their error lines are written), 2 when the file is refused as a whole."""
    to_stdout = str(output) == "-"
    if as_json and to_stdout:
        raise click.UsageError("--json prints the job object on standard output: give "
                               "-o FILE for the results")
    choice = TemplateChoice(**shaping)
    check_input(input_file, choice)
    table_out = not to_stdout and is_table(output)
    if table_out and choice.template is None:
        raise click.UsageError(f"{storage.name_of(output)} is a table out: it joins the "
                               "answers to a table's rows, so give --template too")
    named: Location = input_file if input_file is not None else Path(f"{choice.after}.jsonl")
    errors_to = errors_path or storage.sibling(named if to_stdout else output,
                                               ".errors.jsonl")
    for location in (output, errors_to):  # an unknown scheme: before the job runs
        storage.check_location(location)
    from cli.embedded import Embedded, run_file  # the whole engine: only this command

    engine, rows = None, None
    if choice.after is not None:  # else no database until every row is a request
        from quotaflow.tables.stages import stage_rows

        engine = Embedded(get_settings(), quiet)

        def job_lines(job_id: str, errors: bool, engine: Embedded = engine) -> Any:
            return map(orjson.loads, engine.lines(job_id, errors))

        rows = stage_rows(engine.job(choice.after), engine.job, job_lines,
                          choice.include_failed)

    def deliver(lines: "OutputLines") -> None:
        if table_out:
            write_table(output, rows.for_join() if rows is not None else named,
                        "custom_id" if rows is not None else choice.id_column,
                        map(orjson.loads, lines(False)), map(orjson.loads, lines(True)))
        else:
            with open_output(output) as out:
                out.writelines(line.encode("utf-8") for line in lines(False))
        error_lines = list(lines(True))
        if error_lines:
            with open_output(errors_to) as out:
                out.write("".join(error_lines).encode("utf-8"))

    with requests_for(input_file, choice, rows) as requests:
        job = run_file(get_settings(), requests, deliver, queue, concurrency, dedup=dedup,
                       quiet=quiet, filename=storage.name_of(named), engine=engine,
                       metadata=choice.metadata(input_file) or None,
                       caps=(max_rpm, max_tpm))
    counts = job["request_counts"]
    if as_json:
        print_json(job)
    if not quiet:
        click.echo(f"job {job['id']} {job['status']}: {counts['completed']} succeeded, "
                   f"{counts['failed']} failed of {counts['total']}", err=True)
        if counts["failed"]:
            click.echo(f"error lines written to {errors_to}", err=True)
    sys.exit(exit_codes.for_job(job))


@cli.command()
@click.argument("input_file", type=INPUT, required=False)
@QUEUE_OPTION
@click.option("--metadata", help='JSON object of strings, e.g. \'{"team": "search"}\'.')
@click.option("--max-attempts", type=click.IntRange(1, 20),
              help="Tries per request at the provider (default: "
                   "QUOTAFLOW_PROVIDER_MAX_ATTEMPTS).")
@click.option("--idempotency-key", metavar="KEY",
              help="Name this submission: sending it again with the same key returns the "
                   "job it made instead of a second one (default: a new key, reused by "
                   "this command's own retries).")
@click.option("--timeout", type=click.FloatRange(min=1), metavar="SECONDS",
              help="How long to wait for the API to store the file before sending it again "
                   "(default: QUOTAFLOW_SUBMIT_TIMEOUT_S, 1800).")
@click.option("--output-format", type=click.Choice(["openai", "anthropic"]),
              help="Output lines: OpenAI batch output lines, or Anthropic Message Batches "
                   "results (default: the format of the file's lines).")
@click.option("--max-rpm", type=click.IntRange(1), metavar="N",
              help="Cap the job's requests per minute inside each deployment's budget.")
@click.option("--max-tpm", type=click.IntRange(1), metavar="N",
              help="Cap the job's tokens per minute (prompt estimate + max_tokens) the same "
                   "way.")
@DEDUP_OPTION
@QUIET_OPTION
@JSON_OPTION
@template_options
def submit(input_file: Location | None, queue: str, metadata: str | None, max_attempts: int | None,
           idempotency_key: str | None, timeout: float | None,
           output_format: str | None, max_rpm: int | None, max_tpm: int | None,
           dedup: bool | None, quiet: bool, as_json: bool, **shaping: Any) -> None:
    """Upload INPUT_FILE to the API as a new job and print its id.

    INPUT_FILE is a JSONL file of requests, or with --template a table whose rows become
    requests (every row is made into its request before anything is sent); a path or
    an s3://, gs:// or az:// URL. With --after JOB instead, the rows are JOB's results. The API
    answers once the whole file is stored (a million lines take tens of seconds); a
    retry after a timeout or a broken connection reuses the key, so it never makes a
    second job.
    """
    settings = get_settings()
    choice = TemplateChoice(**shaping)
    check_input(input_file, choice)
    api = client(submit_timeout=timeout or settings.submit_timeout_s)
    rows = None
    if choice.after is not None:
        from quotaflow.tables.stages import stage_rows

        rows = stage_rows(api.get_job(choice.after), api.get_job, api.output_lines,
                          choice.include_failed)
    name = storage.name_of(input_file) if input_file is not None else f"{choice.after}.jsonl"
    with requests_for(input_file, choice, rows) as requests, \
            request_progress(quiet) as progress:
        total = None if quiet else count_lines(requests)  # a read of the file, for the bar
        task = progress.add_task(f"sending {name}", total=total, unit="lines")
        job = api.create_job(requests, queue,
                             merged_metadata(metadata, choice.metadata(input_file)),
                             max_attempts, idempotency_key=idempotency_key,
                             output_format=output_format, dedup=dedup,
                             on_retry=None if quiet else
                             lambda note: click.echo(f"note: {note}", err=True),
                             filename=name, caps=(max_rpm, max_tpm),
                             on_sent=lambda lines: progress.update(task, completed=lines))
        if total is not None:
            progress.update(task, completed=total, description=f"{job['id']} stored")
    if as_json:
        print_json(job)
    elif not quiet:
        click.echo(job["id"])


@cli.command()
@click.argument("job_id")
@click.option("--watch", is_flag=True,
              help="Follow the job until it ends (a bar on a terminal, a line every few "
                   "seconds elsewhere); then exit 0 if it completed with no failed line, "
                   "3 otherwise.")
@JSON_OPTION
@QUIET_OPTION
def status(job_id: str, watch: bool, as_json: bool, quiet: bool) -> None:
    """Show a job's status and request counts."""
    api = client()
    job = api.get_job(job_id)
    if watch:  # an ended job too: its final progress line is what a script reads
        job = _watch(api, job, quiet)
    code = exit_codes.for_job(job) if watch else exit_codes.OK
    if as_json:
        print_json(job)
    elif not quiet:
        _print_status(api, job)
    sys.exit(code)


def _print_status(api: ApiClient, job: dict[str, Any]) -> None:
    counts = job["request_counts"]
    click.echo(f"{job['id']}  {job['status']}  queue={job['queue']}  "
               f"total={counts['total']} completed={counts['completed']} "
               f"failed={counts['failed']} pending={counts['pending']}  "
               f"cost={cost_text(job.get('cost'))}")
    if job.get("stop_reason"):
        click.echo(f"stopped sending: {job['stop_reason']}")
    with contextlib.suppress(QuotaflowError):  # an older API, or one without PostgreSQL
        click.echo(f"bound: {api.job_bound(job['id'])['summary']}")


def _watch(api: ApiClient, job: dict[str, Any], quiet: bool) -> dict[str, Any]:
    """Follow the job's changes as the API sends them (its event stream), to its end."""
    with request_progress(quiet) as progress:
        task = progress.add_task(job["id"], total=job["request_counts"]["total"])
        for seen in itertools.chain([job], () if job["status"] in FINAL
                                    else api.watch_job(job["id"])):
            job = seen
            counts = job["request_counts"]
            progress.update(task, completed=counts["completed"] + counts["failed"],
                            description=f"{job['id']} {job['status']}")
        return job


@cli.command()
@click.argument("job_id")
@click.option("-o", "--output", type=click.File("w", encoding="utf-8"), default="-",
              help="Where the page goes (default: stdout), e.g. report.html.")
def report(job_id: str, output: IO[str]) -> None:
    """Write a job's report: one HTML page with its plots inline, for any browser, offline."""
    output.write(client().report(job_id))


@cli.command()
@click.argument("job_id")
@JSON_OPTION
def cancel(job_id: str, as_json: bool) -> None:
    """Cancel a job: no new requests are sent; requests in flight finish and are kept."""
    job = client().cancel_job(job_id)
    if as_json:
        print_json(job)
        return
    click.echo(f"{job['id']}  {job['status']}")


@cli.command()
@click.argument("job_id")
@JSON_OPTION
def retry(job_id: str, as_json: bool) -> None:
    """Run a job's failed requests again (invalid lines are not retried)."""
    job = client().retry_job(job_id)
    if as_json:
        print_json(job)
        return
    click.echo(f"{job['id']}  {job['status']}  retrying {job['retried']} failed requests")


@cli.command()
@click.argument("job_id")
@JSON_OPTION
def delete(job_id: str, as_json: bool) -> None:
    """Delete a finished job's results and its lines' bodies (cancel a running one first);
    the job stays listed, marked deleted."""
    job = client().delete_job(job_id)
    if as_json:
        print_json(job)
        return
    click.echo(f"{job['id']}  {job['status']}  deleted")


@cli.command("jobs")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 100))
@click.option("--json", "as_json", is_flag=True, help="Print the job objects as a JSON list.")
def list_jobs(limit: int, as_json: bool) -> None:
    """List the newest jobs."""
    found = client().list_jobs(limit)
    if as_json:
        print_json(found)
        return
    for job in found:
        counts = job["request_counts"]
        done = f"{counts['completed'] + counts['failed']}/{counts['total']}"
        click.echo(f"{job['id']}  {job['status']:<11} {job['queue']:<8} {done:>15}  "
                   f"{cost_text(job.get('cost'))}")


def cost_text(cost: dict[str, Any] | None) -> str:
    """A job's cost for people: '-' before any call, '+?' where some were unpriced."""
    if not cost or not cost.get("by_deployment"):
        return "-"
    if cost.get("currency") is None:
        return "unknown (no prices)"
    return money(cost["total"], cost["currency"]) + ("" if cost.get("complete") else " +?")


from cli import audit, downloads, estimate, keys, limits, services, webhooks  # noqa: E402  (registers them)

downloads.register(cli)
services.register(cli)
limits.register(cli)
keys.register(cli)
estimate.register(cli)
webhooks.register(cli)
audit.register(cli)


def main() -> None:
    """Console entry point: quotaflow's errors end the command with their message."""
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(exit_codes.ABORTED)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except QuotaflowError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(exit_codes.for_error(exc))
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
