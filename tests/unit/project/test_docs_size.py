"""docs/benchmarks.md holds today's figures, not the history of how they were reached.

Each benchmark keeps its command, the machine it ran on and its latest tables with their
commit; superseded runs and the passes of work behind them live in git. A page that grows
past the limit is turning back into a lab notebook: move the older runs out, don't raise it.
"""

from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[3] / "docs" / "benchmarks.md"
MOST_LINES = 600


def test_benchmarks_page_holds_current_figures_only() -> None:
    lines = len(BENCHMARKS.read_text().splitlines())
    assert lines <= MOST_LINES, (
        f"docs/benchmarks.md has {lines} lines (at most {MOST_LINES}): keep the latest "
        "table of each benchmark and leave superseded runs to git"
    )
