"""docs/api/python-client.md's in-process examples run as written (on a SQLite file of
their own and the mock provider), so the page cannot drift from the client."""

import contextlib
import io
import re
from pathlib import Path

import pytest

from quotaflow.config import get_settings

PAGE = Path(__file__).resolve().parents[3] / "docs" / "api" / "python-client.md"
BLOCKS = [block for block in re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)
          if "embedded(" in block]


def test_the_page_has_in_process_examples() -> None:
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("number", range(len(BLOCKS)))
def test_an_in_process_example_runs(number: int, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("QUOTAFLOW_DATABASE_URL", f"sqlite:///{tmp_path / 'quotaflow.db'}")
    monkeypatch.delenv("QUOTAFLOW_DEPLOYMENTS_FILE", raising=False)
    get_settings.cache_clear()
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(BLOCKS[number], f"python-client.md block {number}", "exec"), {})
    finally:
        get_settings.cache_clear()
    assert "simulated reply to:" in out.getvalue() or "batch_" in out.getvalue()
