"""MkDocs hook: the configuration reference, rendered from the code at build time.

docs/configuration.md holds markers where the tables go; the rows come from the fields
of `quotaflow.config.Settings` (QUOTAFLOW_* variables) and
`quotaflow.deployments.deployment.Deployment`
(a deployments file's `[deployments.NAME]` keys), their types, defaults and
`Field(description=...)`. A hand-written list drifts from the code; this one cannot, and
a field without a description stops the build (and tests/unit/config/test_config_reference.py).
"""

from __future__ import annotations

import ipaddress
import sys
import types
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

# mkdocs loads this file by path: the repository root makes `quotaflow` importable from a
# checkout that is not installed.
ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SETTINGS_MARKER = "<!-- quotaflow:settings -->"
DEPLOYMENT_MARKER = "<!-- quotaflow:deployment -->"


def missing_descriptions(model: type[BaseModel]) -> list[str]:
    """Fields of `model` with no description: each one is a gap in the reference."""
    return [name for name, field in model.model_fields.items()
            if not (field.description or "").strip()]


def type_name(annotation: Any) -> str:
    """A field's type as a reader writes the value, not as Python spells it."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return type_name(get_args(annotation)[0])
    if origin is Literal:
        return " \\| ".join(f"`{_value(arg)}`" for arg in get_args(annotation))
    if origin in (Union, types.UnionType):
        names = [type_name(arg) for arg in get_args(annotation) if arg is not type(None)]
        return " or ".join(dict.fromkeys(names))
    if origin is dict or (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
        return "table"
    if origin is tuple:
        items = [type_name(arg) for arg in get_args(annotation) if arg is not Ellipsis]
        return "comma-separated " + " or ".join(f"{name}s" for name in dict.fromkeys(items))
    if annotation in (ipaddress.IPv4Network, ipaddress.IPv6Network):
        return "CIDR network"
    if annotation is SecretStr:
        return "secret string"
    if annotation is Path:
        return "path"
    if annotation is bool:
        return "boolean"
    if annotation is int:
        return "integer"
    if annotation is float:
        return "number"
    if annotation is str:
        return "string"
    return getattr(annotation, "__name__", str(annotation))


def constraints(field: FieldInfo) -> str:
    """The bounds pydantic enforces (gt, ge, lt, le, lengths), e.g. `> 0, <= 20`."""
    parts = []
    shortest = next((m.min_length for m in field.metadata if hasattr(m, "min_length")), None)
    longest = next((m.max_length for m in field.metadata if hasattr(m, "max_length")), None)
    if shortest is not None and shortest == longest:
        return f"length {shortest}"
    for meta in field.metadata:
        for attr, sign in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="),
                           ("min_length", "length >="), ("max_length", "length <=")):
            value = getattr(meta, attr, None)
            if value is not None and isinstance(meta, annotated_types.BaseMetadata):
                parts.append(f"{sign} {_number(value)}")
    return ", ".join(parts)


def default_text(field: FieldInfo) -> str:
    """The default as it would be written in the environment or the TOML file; a field may
    say it in words instead (`json_schema_extra={"default_text": ...}`)."""
    extra = field.json_schema_extra
    if isinstance(extra, dict) and isinstance(extra.get("default_text"), str):
        return str(extra["default_text"])
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if value is None or value == () or value is PydanticUndefined:
        return "unset"
    if isinstance(value, tuple):
        return "`" + ",".join(_value(item) for item in value) + "`"
    return f"`{_value(value)}`"


def reference_table(model: type[BaseModel], *, env_prefix: str | None) -> str:
    """One row per field: its name (as an environment variable where `env_prefix` is given,
    else as a TOML key), type and bounds, default and description."""
    missing = missing_descriptions(model)
    if missing:
        raise ValueError(f"{model.__name__} fields without a description: {', '.join(missing)};"
                         " give each a Field(description=...)")
    head = "variable" if env_prefix is not None else "key"
    rows = [f"| {head} | type | default | description |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():
        key = f"{env_prefix}{name.upper()}" if env_prefix is not None else name
        kind = type_name(field.annotation)
        bounds = constraints(field)
        if bounds:
            kind += f" ({bounds})"
        description = " ".join((field.description or "").split()).replace("|", "\\|")
        rows.append(f"| `{key}` | {kind} | {default_text(field)} | {description} |")
    return "\n".join(rows) + "\n"


def settings_table() -> str:
    """Every QUOTAFLOW_* variable."""
    from quotaflow.config import Settings

    prefix = str(Settings.model_config.get("env_prefix", ""))
    return reference_table(Settings, env_prefix=prefix.upper())


def deployment_table() -> str:
    """Every key of a `[deployments.NAME]` table."""
    from quotaflow.deployments.deployment import Deployment

    return reference_table(Deployment, env_prefix=None)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """MkDocs event: fill the markers of a page with the tables they stand for; a field
    without a description stops the build with its name, not a traceback."""
    try:
        if SETTINGS_MARKER in markdown:
            markdown = markdown.replace(SETTINGS_MARKER, settings_table())
        if DEPLOYMENT_MARKER in markdown:
            markdown = markdown.replace(DEPLOYMENT_MARKER, deployment_table())
    except ValueError as exc:
        from mkdocs.exceptions import PluginError

        raise PluginError(f"configuration reference: {exc}") from None
    return markdown


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, float):
        return _number(value)
    return str(value)


def _number(value: Any) -> str:
    """0.25 stays 0.25, 60.0 becomes 60."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
