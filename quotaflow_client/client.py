"""quotaflow.Client: submit a file, a table or rows, follow the job, read its answers.

    from quotaflow import Client

    client = Client()                      # QUOTAFLOW_API_URL, QUOTAFLOW_API_KEY
    job = client.submit("reviews.parquet", template="Sentiment of: {{ text }}", model="m")
    job.wait(progress=True)
    for row in job.results():              # each input row with its answer columns
        print(row["text"], row["response_text"])

`Client.embedded()` does the same in this process on the embedded defaults, as
`quotaflow run` does. Rows are made into requests by quotaflow/tables/ before anything
is sent, so a row that cannot be (a missing column) raises RowError and submits nothing.
A job made from rows or a table joins its answers back to them in input order; other
jobs give their output lines as the API does.
"""

from collections.abc import Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import pyarrow as pa

from quotaflow.config import Settings, get_settings
from quotaflow.constants import DEFAULT_QUEUE, FINAL_STATUSES
from quotaflow.errors import TableError
from quotaflow.tables import ID_COLUMN_KEY, INPUT_KEY, storage
from quotaflow.tables.join import joined_batches
from quotaflow.tables.requests import (
    RequestShape,
    load_response_format,
    requests_file,
    response_format,
)
from quotaflow.tables.sinks import TableSink
from quotaflow.tables.sources import RowSource, open_table, rows_source, table_format
from quotaflow.tables.stages import STAGE_ID_COLUMN, StageRows, job_rows, stage_metadata
from quotaflow.tables.templates import PromptTemplate
from quotaflow_client.backends import Backend, EmbeddedBackend, HttpBackend
from quotaflow_client.http import ApiClient


class Job:
    """One job: its latest job object (`data`, as GET /jobs/{id} answers) and, for a job
    made from rows or a table, those rows, to join its answers to."""

    def __init__(self, backend: Backend, data: dict[str, Any], source: RowSource | None = None,
                 id_column: str | None = None) -> None:
        self._backend, self.data = backend, data
        self._source, self._id_column = source, id_column

    def __repr__(self) -> str:
        return f"Job({self.id!r}, status={self.status!r})"

    @property
    def id(self) -> str:
        return str(self.data["id"])

    @property
    def status(self) -> str:
        return str(self.data["status"])

    @property
    def request_counts(self) -> dict[str, int]:
        counts: dict[str, int] = self.data["request_counts"]
        return counts

    @property
    def done(self) -> bool:
        return self.status in FINAL_STATUSES

    def refresh(self) -> "Job":
        self.data = self._backend.job(self.id)
        return self

    def wait(self, progress: bool = False) -> "Job":
        """Until the job ends (in process: its batches run now); `progress` shows the
        CLI's bar on a terminal, plain lines elsewhere."""
        self.data = self._backend.wait(self.id, progress)
        return self

    def cancel(self) -> "Job":
        self.data = self._backend.cancel(self.id)
        return self

    def retry(self) -> int:
        """Queue the failed requests again; how many."""
        answer = self._backend.retry(self.id)
        self.refresh()
        return int(answer.get("retried", 0))

    def lines(self, errors: bool = False) -> Iterator[dict[str, Any]]:
        """The job's output lines (or error lines) as the API gives them, in input order."""
        return self._backend.lines(self.id, errors)

    def results(self) -> Iterator[dict[str, Any]]:
        """Each input row with its answer columns (response_text, response_json,
        prompt_tokens, completion_tokens, finish_reason, error), in input order, for a
        job made from rows or a table; the output lines for any other job."""
        if self._source is None:
            yield from self.lines(errors=False)
            return
        for batch in self._batches():
            yield from batch.to_pylist()

    def to_table(self, path: str | Path | None = None) -> pa.Table | str | Path:
        """The rows with their answers: a pyarrow Table, or written to `path` (.parquet or
        .csv; a local path or an s3://, gs:// or az:// URL) a batch at a time, without
        holding the job in memory."""
        if path is None:
            return pa.Table.from_batches(list(self._batches()))
        with TableSink(path) as sink:
            for batch in self._batches():
                sink.write(batch)
        return path if storage.is_url(path) else Path(path)

    def to_pandas(self) -> Any:
        """to_table() as a pandas DataFrame (needs pandas installed)."""
        table = self.to_table()
        assert isinstance(table, pa.Table)
        return table.to_pandas()

    def _batches(self) -> Iterator[pa.RecordBatch]:
        if self._source is None:
            raise TableError(f"job {self.id} was not made from rows or a table this client "
                             "can read: its lines() are its answers")
        return joined_batches(self._source, self._id_column, self.lines(errors=False),
                              self.lines(errors=True))


class Jobs:
    """client.jobs: the jobs the client's key (or this process) can see."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend

    def list(self, limit: int = 20) -> list[Job]:
        """The newest jobs first."""
        return [_job(self._backend, data) for data in self._backend.list_jobs(limit)]

    def get(self, job_id: str) -> Job:
        return _job(self._backend, self._backend.job(job_id))


def _job(backend: Backend, data: dict[str, Any]) -> Job:
    """A job read by id: its rows are found again where its metadata names a table here
    (or, for a stage, the previous job)."""
    metadata = data.get("metadata") or {}
    try:
        source = job_rows(data, backend.job, backend.lines)
    except TableError:  # its table is not on this machine: its lines are its answers
        source = None
    return Job(backend, data, source, metadata.get(ID_COLUMN_KEY))


class Client:
    """quotaflow over HTTP (`Client()`, `Client(base_url, api_key)`) or in this process
    (`Client.embedded()`); a context manager that closes its connections."""

    def __init__(self, base_url: str | None = None, api_key: str | None = None, *,
                 settings: Settings | None = None, timeout: float = 60.0,
                 backend: Backend | None = None) -> None:
        if backend is None:
            settings = settings or get_settings()
            api = ApiClient.from_settings(settings)
            if base_url is not None or api_key is not None:
                key = api_key if api_key is not None else (
                    settings.api_key.get_secret_value() if settings.api_key else None)
                api = ApiClient(base_url or settings.api_url, timeout=timeout, api_key=key,
                                submit_timeout=settings.submit_timeout_s)
            backend = HttpBackend(api)
        self._backend = backend
        self.jobs = Jobs(backend)

    @classmethod
    def embedded(cls, settings: Settings | None = None, concurrency: int = 4,
                 quiet: bool = False) -> "Client":
        """Jobs in this process, on QUOTAFLOW_DATABASE_URL (a SQLite file by default) and
        the deployments file; `quiet` leaves out the mock provider's notice."""
        from quotaflow_client.embedded import Embedded  # the whole engine, only here

        engine = Embedded(settings or get_settings(), quiet=quiet)
        return cls(backend=EmbeddedBackend(engine, concurrency))

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._backend.close()

    def submit(self, data: str | Path | Any = None, *, template: str | Path | None = None,
               model: str | None = None, system: str | None = None,
               max_tokens: int | None = None,
               response_format: Mapping[str, Any] | str | Path | None = None,
               id_column: str | None = None, queue: str = DEFAULT_QUEUE,
               metadata: Mapping[str, str] | None = None, max_attempts: int | None = None,
               dedup: bool | None = None, after: "Job | str | None" = None,
               include_failed: bool = False) -> Job:
        """Submit a JSONL file of requests, or (with `template`) a table's rows: a path to
        a .parquet, .csv or .jsonl file, a list of dicts, a pyarrow Table, a pandas or
        polars DataFrame, or a Hugging Face Dataset or IterableDataset. `template` is the
        template's text, or a Path to its file; `response_format` a JSON Schema (a dict,
        or a path to its file). `after` (a Job or a job id) makes a stage: its rows are
        that ended job's rows with their answers (custom_id, response_text,
        response_json, ...; failed ones only with `include_failed`)."""
        given = dict(metadata or {})
        if after is not None:
            if data is not None or template is None or id_column is not None:
                raise TableError("a stage takes after=job and a template, and no data or "
                                 "id_column: its rows keep their custom_id")
            stage = self._stage_rows(after, include_failed)
            given = stage_metadata(stage.job_id, include_failed) | given
            job = self._submit_rows(stage, STAGE_ID_COLUMN, f"{stage.job_id}.jsonl",
                                    template, model, system, max_tokens, response_format,
                                    queue, given, max_attempts, dedup)
            job._source = stage.for_join()
            return job
        if template is None:
            if not isinstance(data, str | Path):
                raise TableError("rows need a template: submit(rows, template=...)")
            name = storage.name_of(data)
            if table_format(Path(name)) in ("parquet", "csv"):
                raise TableError(f"{name} is a table: give template=... to say what "
                                 "each row asks")
            with storage.local_input(data) as path:
                made = self._backend.create(path, queue=queue, metadata=given or None,
                                            max_attempts=max_attempts, dedup=dedup,
                                            filename=name)
            return Job(self._backend, made)
        if isinstance(data, str | Path):
            source, name = open_table(data), storage.name_of(data)
            where = str(data) if storage.is_url(data) else str(Path(data).resolve())
            given = {INPUT_KEY: where} | given
        else:
            source, name = rows_source(data), "rows"
        if id_column is not None:
            given = {ID_COLUMN_KEY: id_column} | given
        return self._submit_rows(source, id_column, name, template, model, system,
                                 max_tokens, response_format, queue, given, max_attempts,
                                 dedup)

    def _stage_rows(self, after: "Job | str", include_failed: bool) -> StageRows:
        """The rows of a stage after `after`: a Job that holds its rows (a program's) joins
        its answers to them; a job id finds them from its metadata."""
        from quotaflow.tables.stages import stage_rows

        if isinstance(after, Job):
            previous = after.refresh()
            if previous._source is not None:
                stage_rows(previous.data, self._backend.job, self._backend.lines)  # ended?
                return StageRows(previous.id, previous._source, previous._id_column,
                                 self._backend.lines, include_failed)
            after = previous.id
        return stage_rows(self._backend.job(after), self._backend.job, self._backend.lines,
                          include_failed)

    def _submit_rows(self, source: RowSource, id_column: str | None, name: str,
                     template: str | Path, model: str | None, system: str | None,
                     max_tokens: int | None,
                     response_format: Mapping[str, Any] | str | Path | None, queue: str,
                     given: dict[str, str], max_attempts: int | None,
                     dedup: bool | None) -> Job:
        prompt = (PromptTemplate.from_path(template) if isinstance(template, Path)
                  else PromptTemplate(template))
        shape = RequestShape(model=model, system=system, max_tokens=max_tokens,
                             response_format=_response_format(response_format),
                             id_column=id_column)
        with requests_file(source, prompt, shape) as requests:
            made = self._backend.create(requests, queue=queue, metadata=given or None,
                                        max_attempts=max_attempts, dedup=dedup, filename=name)
        return Job(self._backend, made, source, id_column)


def _response_format(given: Mapping[str, Any] | str | Path | None) -> dict[str, Any] | None:
    if given is None:
        return None
    if isinstance(given, str | Path):
        return load_response_format(Path(given))
    return response_format(dict(given))
