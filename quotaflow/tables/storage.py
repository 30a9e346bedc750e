"""Object storage paths in and out: s3://, gs:// and az:// through fsspec.

Credentials are each filesystem's own default chain (s3fs: botocore's, which reads
AWS_ENDPOINT_URL for an S3-compatible server; gcsfs: Google's application default
credentials; adlfs: the AZURE_STORAGE_* variables and azure-identity): quotaflow
passes none and logs none. An object in is copied to a local temporary file a block
at a time, never read whole: ingest uploads a file whose length it knows, and a table
is read twice (its rows made into requests, then its answers joined back), so one
streamed copy is read locally from then on. An output is written straight to the
object as it is made, through fsspec's buffered writer: a multipart upload, a part
each BLOCK_BYTES, sent while the next one fills, that the store makes visible only once
it completes; a failure
discards the upload, so no partial object ever stands under the final key (the
`.part` rename of a local file, for objects).
"""

import contextlib
import re
import shutil
import tempfile
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import IO, Any

from quotaflow.errors import StorageError

# One block read or written at a time: large enough for few requests per object (S3's
# multipart parts must be 5 MiB at least), small enough to keep memory flat.
BLOCK_BYTES = 16 * 1024 * 1024
LIBRARIES = {"s3": "s3fs", "gs": "gcsfs", "az": "adlfs"}
_URL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")

Location = str | Path


def is_url(location: Location) -> bool:
    """Whether `location` is a URL (any scheme) rather than a local path."""
    return isinstance(location, str) and _URL.match(location) is not None


def check_url(url: str) -> str:
    """`url` itself, or StorageError for a scheme quotaflow does not read."""
    found = _URL.match(url)
    scheme = found[1].lower() if found else ""
    if found is None or scheme not in LIBRARIES:
        raise StorageError(f"{url}: quotaflow reads local paths and s3://, gs:// and az:// "
                           "URLs, not " + (f"{scheme}://" if scheme else "this"))
    if not url[found.end():].strip("/"):
        raise StorageError(f"{url}: give a bucket (or container) and an object's key")
    return url


def name_of(location: Location) -> str:
    """The last part of a path or URL: what a job's filename and messages show."""
    if is_url(location):
        return PurePosixPath(str(location).split("://", 1)[1]).name
    return Path(location).name


def check_location(location: Location) -> None:
    """StorageError now, before any work, for a URL whose scheme quotaflow does not read
    or whose library is not installed; nothing for a local path."""
    if is_url(location):
        _filesystem(str(location))


def _filesystem(url: str) -> tuple[Any, str]:
    """fsspec's filesystem for the URL's scheme (default credentials) and the path in it."""
    check_url(url)
    try:
        import fsspec
    except ImportError:
        raise StorageError(f"{url}: object storage needs fsspec: "
                           "pip install 'quotaflow[storage]'") from None
    try:
        found: tuple[Any, str] = fsspec.core.url_to_fs(url)
        return found
    except ImportError:
        library = LIBRARIES[url.split("://", 1)[0].lower()]
        raise StorageError(f"{url}: this scheme needs the {library} package: "
                           "pip install 'quotaflow[storage]'") from None


def storage_error(url: str, doing: str, exc: BaseException) -> StorageError:
    """What went wrong with `url`, for the person at the command line (no traceback)."""
    kind = exc.__class__.__name__
    if isinstance(exc, FileNotFoundError):
        return StorageError(f"{url}: no such object (or no such bucket)")
    if isinstance(exc, PermissionError) or kind in ("NoCredentialsError",
                                                    "PartialCredentialsError"):
        return StorageError(f"cannot {doing} {url}: access denied or no credentials ({kind}); "
                            "check the credentials of your cloud's standard chain")
    if isinstance(exc, StorageError):
        return exc
    return StorageError(f"cannot {doing} {url}: {kind}: {exc}")


def open_object(url: str, mode: str = "rb") -> IO[bytes]:
    """The object at `url` opened for streaming ('rb' or 'wb'), a block at a time."""
    fs, path = _filesystem(url)
    try:
        handle: IO[bytes] = fs.open(path, mode, block_size=BLOCK_BYTES)
    except Exception as exc:
        raise storage_error(url, "read" if "r" in mode else "write", exc) from None
    return handle


def download(url: str, target: Path) -> None:
    """The object copied to `target`, a block at a time."""
    try:
        with open_object(url, "rb") as source, target.open("wb") as out:
            shutil.copyfileobj(source, out, BLOCK_BYTES)
    except StorageError:
        raise
    except Exception as exc:
        raise storage_error(url, "read", exc) from None


class _Upload:
    """An object being written: writes gather into a block, and each full block goes to
    the multipart upload as a part on a thread of its own while the next one fills, so
    the caller's reading (a job's results from the API) and the part's upload overlap.
    One block is in flight at most, so memory holds about three (the filling one, the one
    sent and fsspec's copy of it). A failure of the store is a StorageError naming it,
    at the next write or at the end."""

    def __init__(self, url: str, handle: Any) -> None:
        self.url, self._handle = url, handle
        self._block, self._written = bytearray(), 0
        self._sender = ThreadPoolExecutor(1, thread_name_prefix="quotaflow-upload")
        self._sending: Future[Any] | None = None

    def write(self, data: bytes) -> int:
        self._block += data
        self._written += len(data)
        if len(self._block) >= BLOCK_BYTES:
            self._wait()
            block, self._block = bytes(self._block), bytearray()
            self._sending = self._sender.submit(self._handle.write, block)
        return len(data)

    def _wait(self) -> None:
        sending, self._sending = self._sending, None
        if sending is None:
            return
        try:
            sending.result()
        except Exception as exc:
            raise storage_error(self.url, "write", exc) from None

    def finish(self) -> None:
        """Every byte handed to the upload: the part in flight, then the last block."""
        try:
            self._wait()
            if self._block:
                try:
                    self._handle.write(bytes(self._block))
                except Exception as exc:
                    raise storage_error(self.url, "write", exc) from None
        finally:
            self._sender.shutdown()

    def abandon(self) -> None:
        """The part in flight waited for (its failure is not news), nothing more sent."""
        with contextlib.suppress(Exception):
            self._wait()
        self._sender.shutdown()

    def tell(self) -> int:
        return self._written

    def flush(self) -> None:
        """Parts go as the blocks fill: a flush before the end would send a short one."""

    @property
    def closed(self) -> bool:
        return bool(self._handle.closed)


@contextlib.contextmanager
def object_writer(url: str) -> Iterator[IO[bytes]]:
    """The object at `url` written as the block goes, a multipart upload completed when
    the block ends without an error (the object appears whole) and aborted otherwise."""
    handle = open_object(url, "wb")
    upload = _Upload(url, handle)
    try:
        yield upload  # type: ignore[misc]  # the writing half of IO[bytes]
        upload.finish()
    except BaseException:
        upload.abandon()
        with contextlib.suppress(Exception):
            handle.discard()  # type: ignore[attr-defined]  # fsspec's buffered file: aborts
        # closed as far as fsspec knows: its finalizer would otherwise complete the upload
        # (or fail to, on the buffer discard() dropped)
        with contextlib.suppress(Exception):
            handle.closed = True  # type: ignore[misc]
        raise
    try:
        handle.close()  # completes the upload: the object appears whole, or not at all
    except Exception as exc:
        raise storage_error(url, "write", exc) from None


def upload(source: Path, url: str) -> None:
    """`source` streamed to `url` as a multipart upload, discarded on any failure."""
    with object_writer(url) as out, source.open("rb") as data:
        while piece := data.read(BLOCK_BYTES):
            out.write(piece)


@contextlib.contextmanager
def local_input(location: Location) -> Iterator[Path]:
    """A local path to read `location` from: itself, or an object's streamed copy (with
    the object's name, so its suffix still says its format), removed on leaving."""
    if not is_url(location):
        yield Path(location)
        return
    url = check_url(str(location))
    with tempfile.TemporaryDirectory(prefix="quotaflow-in-") as folder:
        target = Path(folder) / (name_of(url) or "object")
        download(url, target)
        yield target


@contextlib.contextmanager
def output_file(location: Location) -> Iterator[IO[bytes]]:
    """`location` opened to write bytes: a local file, or an object written as it goes
    (object_writer: it appears only once the block ends without an error)."""
    if not is_url(location):
        with Path(location).open("wb") as out:
            yield out
        return
    url = check_url(str(location))
    check_location(url)  # an unknown scheme or a missing library, before any work is done
    with object_writer(url) as out:
        yield out


def sibling(location: Location, suffix: str) -> Location:
    """`location` with its suffix replaced: out.jsonl -> out.errors.jsonl, for a URL too."""
    if not is_url(location):
        path = Path(location)
        return path.with_name(path.stem + suffix)
    text = str(location)
    head, _, last = text.rpartition("/")
    return f"{head}/{PurePosixPath(last).stem}{suffix}"
