"""The rooms of quotaflow/ (docs/architecture.md) stay on their floors: every import points
down the order below, so there are no circles, and the domain never imports the
frameworks that api/, workers/ and cli/ translate from."""

import ast
import re
from pathlib import Path

import pytest

from tests.harness.servers import ROOT

# Bottom to top: a room may import the rooms before it, never one after it.
FLOORS = [
    "constants", "errors", "jsoncodec", "redis_urls", "redis_clients", "redis_scripts",
    "tables", "deployments", "settings_renames", "config", "db", "models", "store",
    "budget", "tenants", "providers", "dispatch", "jobs", "results", "ingest", "offload",
    "observe", "execution", "compat", "webhooks", "preflight", "runtime",
]
FRAMEWORKS = {"celery", "kombu", "fastapi", "starlette", "click"}


def _room(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "quotaflow" or len(parts) < 2:
        return None
    return parts[1]


def _imports(path: Path) -> set[str]:
    """The modules a file imports, by absolute name (`from quotaflow import x` names
    quotaflow.x)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            if node.module == "quotaflow":
                found |= {f"quotaflow.{alias.name}" for alias in node.names}
    return found


def _rooms_arrows() -> dict[tuple[str, str], str]:
    arrows: dict[tuple[str, str], str] = {}
    for path in sorted((ROOT / "quotaflow").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        source = _room(module)
        for target in map(_room, _imports(path)):
            if source and target and target != source and not target.startswith("_"):
                arrows.setdefault((source, target), module)
    return arrows


def test_every_room_is_on_a_floor() -> None:
    rooms = {_room(".".join(p.relative_to(ROOT).with_suffix("").parts))
             for p in (ROOT / "quotaflow").rglob("*.py")} - {"__init__", None}
    assert rooms == set(FLOORS)


def test_every_import_points_down() -> None:
    upward = [f"{where} ({source}) imports {target}"
              for (source, target), where in _rooms_arrows().items()
              if FLOORS.index(target) > FLOORS.index(source)]
    assert not upward, upward


def test_the_rooms_are_few_arrows_apart() -> None:
    # Counted this way, the 59 flat rooms had 248 arrows between them before the rooms were
    # folders, over 4 a room (20 rooms, 107 arrows when they were made). A new room (tables,
    # say) brings its own arrows, so the bound is per room: at most 5 on average, and never
    # more than the flat layout's.
    arrows = len(_rooms_arrows())
    assert arrows <= 5 * len(FLOORS) and arrows < 248, (arrows, len(FLOORS))


def test_the_layout_page_gives_the_counted_figures() -> None:
    said = re.search(r"the\s+(\d+) rooms have (\d+) arrows",
                     (ROOT / "docs" / "layout.md").read_text())
    assert said, "docs/layout.md no longer gives the rooms' and arrows' figures"
    assert (int(said[1]), int(said[2])) == (len(FLOORS), len(_rooms_arrows()))


@pytest.mark.parametrize("room", FLOORS)
def test_the_domain_imports_no_framework(room: str) -> None:
    folder = ROOT / "quotaflow" / room
    paths = sorted(folder.rglob("*.py")) if folder.is_dir() else [folder.with_suffix(".py")]
    used = {(p.name, m) for p in paths for m in _imports(p) if m.split(".")[0] in FRAMEWORKS}
    assert not used, used
