"""Object storage paths told from local ones, refused when quotaflow cannot read them,
and an upload that fails discarded rather than left as a partial object."""

from pathlib import Path
from typing import Any

import pytest

from quotaflow.errors import StorageError
from quotaflow.tables import storage
from quotaflow.tables.sinks import TableSink, out_format
from quotaflow.tables.sources import open_table


def test_urls_and_local_paths() -> None:
    assert storage.is_url("s3://bucket/key.jsonl") and storage.is_url("ftp://x/y")
    assert not storage.is_url(Path("s3:/bucket")) and not storage.is_url("data/in.jsonl")
    assert storage.name_of("gs://b/folder/in.parquet") == "in.parquet"
    assert storage.sibling("az://c/out/run.jsonl", ".errors.jsonl") == (
        "az://c/out/run.errors.jsonl")
    assert storage.sibling(Path("out/run.jsonl"), ".errors.jsonl") == Path(
        "out/run.errors.jsonl")
    assert out_format("s3://b/answers.parquet") == "parquet"


@pytest.mark.parametrize(("url", "message"), [
    ("ftp://host/in.jsonl", "ftp://host/in.jsonl: quotaflow reads local paths and s3://, "
                            "gs:// and az:// URLs, not ftp://"),
    ("s3://", "s3://: give a bucket (or container) and an object's key"),
])
def test_unusable_urls_are_named(url: str, message: str) -> None:
    with pytest.raises(StorageError) as raised:
        storage.check_url(url)
    assert str(raised.value) == message
    with pytest.raises(StorageError), storage.local_input(url):
        pass


def test_a_scheme_whose_library_is_missing_says_what_to_install(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import fsspec.core

    def missing(url: str) -> Any:
        raise ImportError("Install gcsfs to access Google Storage")

    monkeypatch.setattr(fsspec.core, "url_to_fs", missing)
    with pytest.raises(StorageError, match=r"gs://b/in.parquet: this scheme needs the gcsfs "
                                           r"package: pip install 'quotaflow\[storage\]'"):
        open_table("gs://b/in.parquet").columns()


class _Upload:
    def __init__(self) -> None:
        self.written, self.discarded, self.completed = 0, False, False

    def write(self, piece: bytes) -> None:
        self.written += len(piece)
        raise OSError("connection reset")

    def discard(self) -> None:
        self.discarded = True

    def close(self) -> None:
        self.completed = True


def test_a_failed_upload_is_discarded_not_completed(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    upload = _Upload()
    monkeypatch.setattr(storage, "open_object", lambda url, mode="rb": upload)
    (tmp_path / "out.jsonl").write_bytes(b"{}\n")
    with pytest.raises(StorageError, match=r"cannot write s3://b/out\.jsonl: OSError"):
        storage.upload(tmp_path / "out.jsonl", "s3://b/out.jsonl")
    assert upload.discarded and not upload.completed


class _Object:
    """An object's writer as fsspec gives it: what was written, discarded or completed."""

    def __init__(self) -> None:
        self.data, self.discarded, self.completed, self.closed = b"", False, False, False

    def write(self, piece: bytes) -> int:
        self.data += piece
        return len(piece)

    def tell(self) -> int:
        return len(self.data)

    def discard(self) -> None:
        self.discarded = True

    def close(self) -> None:
        self.completed = self.closed = True


def test_a_table_out_is_written_to_its_object_as_it_goes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    made: list[_Object] = []
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(storage, "BLOCK_BYTES", 8)  # a part as soon as a few bytes are in
    monkeypatch.setattr(storage, "check_location", lambda location: None)
    monkeypatch.setattr(storage, "open_object",
                        lambda url, mode="rb": made.append(_Object()) or made[-1])
    with pytest.raises(RuntimeError), TableSink("s3://b/out.parquet") as sink:
        sink.write(pa.record_batch({"a": [1]}))
        raise RuntimeError("the join found the wrong table")
    assert made[0].discarded and not made[0].completed
    with TableSink("s3://b/out.parquet") as sink:
        sink.write(pa.record_batch({"a": [1]}))
        sink.write(pa.record_batch({"a": [2]}))  # the first part is waited for first
        assert made[1].data.startswith(b"PAR1")  # into the object, not a local copy
        assert not list(tmp_path.iterdir())
    assert made[1].completed and not made[1].discarded
    assert pq.read_table(pa.BufferReader(made[1].data)).column("a").to_pylist() == [1, 2]


def test_parts_go_in_order_while_the_next_block_fills(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage, "BLOCK_BYTES", 4)
    made = _Object()
    monkeypatch.setattr(storage, "open_object", lambda url, mode="rb": made)
    with storage.object_writer("s3://b/out.jsonl") as out:
        for piece in (b"ab", b"cdef", b"g", b"hijk", b"l"):
            out.write(piece)
        assert out.tell() == 12
    assert made.data == b"abcdefghijkl" and made.completed


class _FailingPart(_Object):
    def write(self, piece: bytes) -> int:
        raise OSError("connection reset")


def test_a_part_that_fails_in_flight_fails_the_next_write(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage, "BLOCK_BYTES", 4)
    made = _FailingPart()
    monkeypatch.setattr(storage, "open_object", lambda url, mode="rb": made)
    with pytest.raises(StorageError, match=r"cannot write s3://b/out\.jsonl: OSError"), \
            storage.object_writer("s3://b/out.jsonl") as out:
        out.write(b"abcd")  # a part sent: its failure is heard at the next part
        out.write(b"efgh")
    assert made.discarded and not made.completed
