"""quotaflow.Client in this process (issue 50, part 3), on the embedded defaults as
`quotaflow run` works: rows, a DataFrame or a table in, answers joined to the rows out,
jobs listed, cancel and retry, and errors as quotaflow's exception classes."""

import asyncio
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from quotaflow import AsyncClient, Client
from quotaflow.config import Settings
from quotaflow.errors import JobStateError, RowError, TableError


@pytest.fixture
def client(tmp_path: Path) -> Client:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'embedded.db'}",
                        deployments_file=None)
    with Client.embedded(settings, quiet=True) as made:
        yield made


def test_rows_in_answers_joined_out_in_input_order(client: Client) -> None:
    rows = [{"name": f"n{i}", "n": i} for i in range(1, 6)]
    job = client.submit(rows, template="Greet {{ name }} #{{ n }}", model="m", max_tokens=20)
    assert job.status == "in_progress" and job.request_counts["total"] == 5
    assert job.wait().status == "completed"
    answered = list(job.results())
    assert [(r["name"], r["n"], r["custom_id"]) for r in answered] == [
        (f"n{i}", i, str(i)) for i in range(1, 6)]
    assert answered[2]["response_text"] == "simulated reply to: Greet n3 #3"
    assert answered[2]["finish_reason"] == "stop" and answered[2]["error"] is None
    assert answered[2]["prompt_tokens"] > 0 and answered[2]["completion_tokens"] > 0
    assert [j.id for j in client.jobs.list()] == [job.id]


def test_a_table_file_and_its_id_column(client: Client, tmp_path: Path) -> None:
    path = tmp_path / "data.parquet"
    pq.write_table(pa.table({"key": ["k1", "k2"], "text": ["a", "b"]}), path)
    job = client.submit(path, template="Echo {{ text }}", id_column="key").wait()
    table = job.to_table()
    assert table.column("key").to_pylist() == ["k1", "k2"]
    assert table.column("response_text").to_pylist() == ["simulated reply to: Echo a",
                                                         "simulated reply to: Echo b"]
    out = job.to_table(tmp_path / "out.csv")
    assert out.read_text().splitlines()[0].startswith('"key","text","custom_id"')
    again = client.jobs.get(job.id)  # read by id: its rows found by its metadata
    assert [(r["key"], r["text"]) for r in again.results()] == [("k1", "a"), ("k2", "b")]


def test_a_dataframe_and_the_async_client(client: Client) -> None:
    pandas = pytest.importorskip("pandas")
    frame = pandas.DataFrame({"q": ["x", "y"]})

    async def main() -> list[str]:
        async_client = AsyncClient(client=client)
        job = await async_client.submit(frame, template="{{ q }}")
        await job.wait()
        return [row["response_text"] async for row in job.results()]

    assert asyncio.run(main()) == ["simulated reply to: x", "simulated reply to: y"]


def test_a_jsonl_file_of_requests_gives_its_output_lines(client: Client) -> None:
    job = client.submit(Path(__file__).parents[3] / "examples" / "prompts.jsonl").wait()
    first = next(job.results())
    assert first["custom_id"] == "request-0" and first["response"]["status_code"] == 200
    with pytest.raises(TableError, match="not made from rows or a table"):
        job.to_table()


def test_errors_are_quotaflows_and_nothing_is_submitted(client: Client) -> None:
    with pytest.raises(RowError) as caught:
        client.submit([{"q": "a"}, {"x": "b"}], template="{{ q }}")
    assert (caught.value.row, caught.value.column) == (2, "q")
    with pytest.raises(TableError, match="rows need a template"):
        client.submit([{"q": "a"}])
    assert client.jobs.list() == []
    job = client.submit([{"q": "a"}], template="{{ q }}").wait()
    with pytest.raises(JobStateError, match="can no longer be cancelled"):
        job.cancel()
    assert job.retry() == 0  # nothing failed


def test_cancel_before_the_batches_run(client: Client) -> None:
    job = client.submit([{"q": str(i)} for i in range(20)], template="{{ q }}")
    assert job.cancel().status in ("cancelling", "cancelled")
    job.wait()
    assert job.status == "cancelled"
    assert [row["error"] for row in job.results()] == [
        f"line {n}: not sent because the job was cancelled" for n in range(1, 21)]
