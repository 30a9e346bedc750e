"""Paths on the command line that may be objects: s3://, gs:// and az:// URLs pass as
text (quotaflow/tables/storage.py reads and writes them), anything else as a local Path with
click's own checks."""

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import click

from quotaflow.errors import StorageError
from quotaflow.tables import storage


class LocationType(click.ParamType):  # type: ignore[type-arg]  # generic from click 8.2
    """A local path (checked as click.Path checks it) or an object storage URL."""

    name = "path"

    def __init__(self, exists: bool = False, allow_dash: bool = False) -> None:
        self._local = click.Path(exists=exists, dir_okay=False, allow_dash=allow_dash,
                                 path_type=Path)

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> storage.Location:
        if isinstance(value, Path) or not storage.is_url(str(value)):
            converted: Path = self._local.convert(value, param, ctx)
            return converted
        try:
            return storage.check_url(str(value))
        except StorageError as exc:
            self.fail(str(exc), param, ctx)


INPUT = LocationType(exists=True)
OUTPUT = LocationType(allow_dash=True)


@contextlib.contextmanager
def open_output(location: storage.Location) -> Iterator[IO[bytes]]:
    """OUTPUT opened to write bytes: stdout for '-', a local file, or an object written
    as it goes (it appears only once the command's writing ends without an error)."""
    if storage.is_url(location):
        with storage.output_file(location) as out:
            yield out
        return
    with click.open_file(str(location), "wb") as local:
        yield local
