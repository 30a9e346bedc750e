"""README's map of the docs points at pages that exist.

`mkdocs build --strict` checks the links between pages, but README.md lies outside the
site; its relative links are checked here, so the map cannot point at a moved page.
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_readme_links_point_at_files_that_exist() -> None:
    readme = (ROOT / "README.md").read_text()
    targets = [target.split("#")[0] for target in re.findall(r"\]\(([^)\s]+)\)", readme)
               if "://" not in target]
    assert len(targets) > 10, "README should map the docs"
    missing = [target for target in targets if not (ROOT / target).is_file()]
    assert missing == [], f"README links to missing files: {missing}"


def test_every_page_of_the_site_is_in_readme_map() -> None:
    readme = (ROOT / "README.md").read_text()
    pages = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "docs").rglob("*.md"))
    unmapped = [page for page in pages if f"({page})" not in readme]
    assert unmapped == [], f"pages missing from README's map of the docs: {unmapped}"
