"""The CLI's side of tables: the template options of `submit` and `run`, and the table
out of `run -o` and `results -o` (the conversion itself is quotaflow/tables/).

A job made from a table keeps where the table was (`quotaflow_input`) and its id column
(`quotaflow_id_column`) in its metadata, so `quotaflow results JOB -o out.parquet` on
the same machine finds the rows to join the answers to without being told again.
"""

import contextlib
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from quotaflow.tables import ID_COLUMN_KEY, INPUT_KEY, storage
from quotaflow.tables.storage import Location

if TYPE_CHECKING:  # pyarrow is loaded only by the commands that read a table
    from quotaflow.tables.sources import RowSource


def template_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--template and what shapes each row's request, on `submit` and `run`."""
    options = [
        click.option("--template", "template", metavar="PROMPT.j2",
                     type=click.Path(exists=True, dir_okay=False, path_type=Path),
                     help="A Jinja2 template over each row's columns: its text is the "
                          "row's user message (INPUT_FILE is then a table: .parquet, .csv "
                          "or .jsonl rows; docs/formats/tables.md)."),
        click.option("--model", help="The model every row's request asks for."),
        click.option("--system", help="A system message before every row's prompt."),
        click.option("--max-tokens", type=click.IntRange(min=1),
                     help="max_tokens of every row's request."),
        click.option("--response-format", metavar="SCHEMA.json",
                     type=click.Path(exists=True, dir_okay=False, path_type=Path),
                     help="A JSON Schema the answers must follow (structured output)."),
        click.option("--id-column", metavar="COLUMN",
                     help="The column whose value is each row's custom_id (default: the "
                          "row's number, from 1)."),
        click.option("--after", metavar="JOB",
                     help="A stage: the rows are JOB's results (its rows' columns, "
                          "custom_id, response_text, response_json, usage, finish_reason, "
                          "error) instead of INPUT_FILE; needs --template "
                          "(docs/formats/storage.md#stages)."),
        click.option("--include-failed", is_flag=True,
                     help="With --after: keep the rows whose answer failed (their error "
                          "column says why); by default they are left out."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


@dataclass(frozen=True)
class TemplateChoice:
    template: Path | None
    model: str | None
    system: str | None
    max_tokens: int | None
    response_format: Path | None
    id_column: str | None
    after: str | None = None
    include_failed: bool = False

    def metadata(self, input_file: Location | None) -> dict[str, str]:
        """What the job keeps to find its rows again (empty for a JSONL of requests)."""
        if self.after is not None:
            from quotaflow.tables.stages import stage_metadata

            return stage_metadata(self.after, self.include_failed)
        if self.template is None or input_file is None:
            return {}
        where = str(input_file) if storage.is_url(input_file) else str(Path(input_file).resolve())
        found = {INPUT_KEY: where}
        return found | ({ID_COLUMN_KEY: self.id_column} if self.id_column else {})


def check_input(input_file: Location | None, choice: TemplateChoice) -> None:
    """INPUT_FILE or --after JOB, one of them, and what --after needs."""
    if choice.after is None:
        if input_file is None:
            raise click.UsageError("give INPUT_FILE (or --after JOB for a stage)")
        if choice.include_failed:
            raise click.UsageError("--include-failed is for a stage: give --after JOB")
        return
    if input_file is not None:
        raise click.UsageError("give INPUT_FILE or --after JOB, not both")
    if choice.template is None:
        raise click.UsageError("--after JOB needs --template PROMPT.j2 to say what each of "
                               "its rows asks next")
    if choice.id_column is not None:
        raise click.UsageError("a stage's rows keep their custom_id: leave out --id-column")


@contextlib.contextmanager
def requests_for(input_file: Location | None, choice: TemplateChoice,
                 rows: "RowSource | None" = None) -> Iterator[Path]:
    """The JSONL file of requests to send: INPUT_FILE itself (an object's streamed local
    copy), or its rows made into requests through the template (every row first: a
    failing row stops here)."""
    from quotaflow.tables.sources import table_format

    if choice.template is None:
        assert input_file is not None
        shaping = [name for name, value in (
            ("--model", choice.model), ("--system", choice.system),
            ("--max-tokens", choice.max_tokens), ("--response-format", choice.response_format),
            ("--id-column", choice.id_column)) if value is not None]
        name = storage.name_of(input_file)
        if table_format(Path(name)) in ("parquet", "csv"):
            raise click.UsageError(f"{name} is a table: give --template PROMPT.j2 "
                                   "to say what each row asks")
        if shaping:
            raise click.UsageError(f"{', '.join(shaping)} shape a table's rows: give "
                                   "--template too")
        with storage.local_input(input_file) as local:
            yield local
        return
    from quotaflow.tables.requests import RequestShape, load_response_format, requests_file
    from quotaflow.tables.sources import open_table
    from quotaflow.tables.stages import STAGE_ID_COLUMN
    from quotaflow.tables.templates import PromptTemplate

    arrow_memory_from_malloc()

    shape = RequestShape(
        model=choice.model, system=choice.system, max_tokens=choice.max_tokens,
        response_format=(load_response_format(choice.response_format)
                         if choice.response_format else None),
        id_column=STAGE_ID_COLUMN if rows is not None else choice.id_column)
    if rows is None:
        assert input_file is not None
        rows = open_table(input_file)
    with requests_file(rows, PromptTemplate.from_path(choice.template), shape) as path:
        yield path


def arrow_memory_from_malloc() -> None:
    """Arrow's buffers from the C library's malloc in the CLI's own process: pyarrow's
    default pool (mimalloc or jemalloc) keeps the pages each streamed batch frees, so a
    large table's RSS climbs though one batch at a time is held. ARROW_DEFAULT_MEMORY_POOL,
    where set, still decides; a program using the Python client keeps the pool it has."""
    import os

    if not os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        import pyarrow as pa

        pa.set_memory_pool(pa.system_memory_pool())


def merged_metadata(given: str | None, kept: dict[str, str]) -> str | None:
    """--metadata's JSON object with what a table's job keeps added."""
    if not kept:
        return given
    try:
        value = json.loads(given) if given else {}
    except ValueError:
        return given  # the API refuses it, naming the parameter
    return json.dumps(kept | value) if isinstance(value, dict) else given


def write_table(out: Location, input_file: "Location | RowSource", id_column: str | None,
                results: Iterable[dict[str, Any]], errors: Iterable[dict[str, Any]],
                on_rows: Callable[[int], None] | None = None) -> int:
    """The input's rows and their answers written to OUT (.parquet or .csv, a path or an
    object); the rows. `on_rows` hears the rows written so far, after each batch."""
    from quotaflow.tables.join import joined_batches
    from quotaflow.tables.sinks import TableSink
    from quotaflow.tables.sources import RowSource, open_table

    arrow_memory_from_malloc()
    source = input_file if isinstance(input_file, RowSource) else open_table(input_file)
    with TableSink(out) as sink:
        for batch in joined_batches(source, id_column, results, errors):
            sink.write(batch)
            if on_rows is not None:
                on_rows(sink.rows)
    return sink.rows


def results_input(job: dict[str, Any], given: Location | None,
                  fetch_job: Callable[[str], dict[str, Any]] | None = None,
                  fetch_lines: Callable[[str, bool], Iterable[dict[str, Any]]] | None = None,
                  ) -> tuple["Location | RowSource", str | None]:
    """The table a job was made from: --input, or the one its metadata names (a local
    path where it is on this machine, or an object's URL); for a stage, the previous
    job's rows with their answers, fetched again."""
    from quotaflow.tables.stages import AFTER_KEY, job_rows

    metadata = job.get("metadata") or {}
    id_column = metadata.get(ID_COLUMN_KEY)
    if given is not None:
        return given, id_column
    if metadata.get(AFTER_KEY) and fetch_job is not None and fetch_lines is not None:
        rows = job_rows(job, fetch_job, fetch_lines)
        assert rows is not None
        return rows, id_column
    kept = metadata.get(INPUT_KEY)
    if kept and storage.is_url(kept):
        return str(kept), id_column
    if kept and Path(kept).is_file():
        return Path(kept), id_column
    where = f" ({kept} is not here)" if kept else ""
    raise click.UsageError(f"a table out joins the answers to the job's input rows: give "
                           f"--input TABLE, the table {job['id']} was made from{where}")


def is_table(path: Location) -> bool:
    from quotaflow.tables.sinks import out_format

    return out_format(path) is not None
