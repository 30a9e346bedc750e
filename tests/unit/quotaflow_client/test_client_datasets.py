"""quotaflow.Client with Hugging Face datasets as rows: a Dataset (built in the test
with Dataset.from_dict, never loaded from a hub) and an IterableDataset, each row's
answer joined back to it in the dataset's order, through a shuffle's indices too."""

from pathlib import Path

import pytest
from datasets import Dataset

from quotaflow import Client
from quotaflow.config import Settings
from quotaflow.tables import sources
from quotaflow.tables.sources import DatasetRows, rows_source


@pytest.fixture
def client(tmp_path: Path) -> Client:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'embedded.db'}",
                        deployments_file=None)
    with Client.embedded(settings, quiet=True) as made:
        yield made


def test_a_dataset_and_an_iterable_dataset_as_rows(client: Client) -> None:
    dataset = Dataset.from_dict({"key": ["a", "b", "c", "d"], "n": [1, 2, 3, 4]})
    shuffled = dataset.shuffle(seed=3)  # an indices mapping over the same Arrow table
    order = shuffled["key"]
    assert order != ["a", "b", "c", "d"]
    job = client.submit(shuffled, template="{{ key }} is {{ n }}", id_column="key").wait()
    assert job.status == "completed"
    answered = list(job.results())
    assert [row["key"] for row in answered] == order
    assert [row["response_text"] for row in answered] == [
        f"simulated reply to: {row['key']} is {row['n']}" for row in answered]
    streamed = client.submit(dataset.to_iterable_dataset(), template="{{ key }}").wait()
    table = streamed.to_table()
    assert table.column("key").to_pylist() == ["a", "b", "c", "d"]
    assert table.column("custom_id").to_pylist() == ["1", "2", "3", "4"]


def test_a_dataset_is_read_a_batch_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sources, "BATCH_ROWS", 2)
    dataset = Dataset.from_dict({"q": [f"q{i}" for i in range(5)]})
    for given in (dataset, dataset.to_iterable_dataset()):
        source = rows_source(given)
        assert isinstance(source, DatasetRows)
        assert [len(rows) for rows in source.row_batches()] == [2, 2, 1]
        assert [batch.num_rows for batch in source.arrow_batches()] == [2, 2, 1]
        assert source.columns() == ["q"]
