"""The configuration reference is generated from the code: every field is described.

docs/hooks.py renders docs/configuration.md's tables from `Settings` and `Deployment` at
`mkdocs build` time; a field without a description would leave a hole in them, so it
fails here (and the build).
"""

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
from pydantic import BaseModel, Field

from quotaflow.config import Settings
from quotaflow.deployments.deployment import Deployment

DOCS = Path(__file__).resolve().parents[3] / "docs"


def load_hooks() -> ModuleType:
    """docs/hooks.py as mkdocs loads it: by path, not as a package."""
    spec = importlib.util.spec_from_file_location("quotaflow_docs_hooks", DOCS / "hooks.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("model", [Settings, Deployment], ids=lambda m: m.__name__)
def test_every_field_has_a_description(model: type[BaseModel]) -> None:
    undescribed = [name for name, field in model.model_fields.items()
                   if not (field.description or "").strip()]
    assert undescribed == [], (
        f"{model.__name__} fields without Field(description=...): {undescribed}; the "
        "configuration reference (docs/configuration.md) is generated from them")


def test_the_tables_list_every_field_with_its_default() -> None:
    hooks = load_hooks()
    settings = hooks.settings_table()
    for name in Settings.model_fields:
        assert f"| `QUOTAFLOW_{name.upper()}` |" in settings
    assert "| `QUOTAFLOW_BATCH_SIZE` | integer (> 0, <= 10000) | `100` |" in settings
    assert "| `QUOTAFLOW_ADMISSION_ORDER` | `mixed` \\| `fifo` | `mixed` |" in settings
    assert "`0,5,300,1800,7200,18000,36000,36000`" in settings
    deployment = hooks.deployment_table()
    for name in Deployment.model_fields:
        assert f"| `{name}` |" in deployment
    assert "| `rpm` | integer (> 0) | required |" in deployment
    assert "| `reconcile_usage` | boolean or `auto` | `auto` |" in deployment


def test_a_field_without_a_description_stops_the_build() -> None:
    hooks = load_hooks()

    class Undescribed(BaseModel):
        described: int = Field(default=1, description="Has one.")
        bare: int = 2

    assert hooks.missing_descriptions(Undescribed) == ["bare"]
    with pytest.raises(ValueError, match="without a description: bare"):
        hooks.reference_table(Undescribed, env_prefix="QUOTAFLOW_")


def test_the_configuration_page_is_filled_by_the_hook() -> None:
    hooks = load_hooks()
    page = (DOCS / "configuration.md").read_text()
    assert hooks.SETTINGS_MARKER in page and hooks.DEPLOYMENT_MARKER in page
    rendered = hooks.on_page_markdown(page, page=None, config=None, files=None)
    assert hooks.SETTINGS_MARKER not in rendered and hooks.DEPLOYMENT_MARKER not in rendered
    assert "`QUOTAFLOW_DATABASE_URL`" in rendered and "| `max_concurrency` |" in rendered
