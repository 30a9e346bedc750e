"""Prompt templates: Jinja2 over a row's columns, sandboxed, strict about names.

A template is user input run once per row, so it runs in Jinja2's SandboxedEnvironment
(no attribute of Python's internals, no file or import). StrictUndefined makes a name
the row does not have an error rather than an empty string: a typo in a column name
must stop the submission at its first row, not send a million prompts with a hole in
them. A null value renders as nothing, as an empty CSV cell does. Every column is a
name in the template, and `row` is the whole row, for a column whose name is not an
identifier (`{{ row["first name"] }}`).
"""

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jinja2 import StrictUndefined, TemplateSyntaxError, UndefinedError
from jinja2.exceptions import SecurityError
from jinja2.sandbox import SandboxedEnvironment

from quotaflow.errors import RowError, TemplateError

_UNDEFINED = re.compile(r"'([^']*)' is undefined")
_NO_ATTRIBUTE = re.compile(r"has no attribute '([^']*)'")


def _blank_none(value: Any) -> Any:
    return "" if value is None else value


class PromptTemplate:
    """One compiled template; render() gives one row's prompt or raises RowError."""

    def __init__(self, source: str, name: str = "the template") -> None:
        environment = SandboxedEnvironment(undefined=StrictUndefined, autoescape=False,
                                           finalize=_blank_none)
        self.name = name
        try:
            self._template = environment.from_string(source)
        except TemplateSyntaxError as exc:
            raise TemplateError(f"{name}, line {exc.lineno}: {exc.message}") from None

    @classmethod
    def from_path(cls, path: Path) -> "PromptTemplate":
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise TemplateError(f"cannot read the template {path}: {exc}") from None
        return cls(source, path.name)

    def render(self, row: Mapping[str, Any], row_no: int) -> str:
        context = {"row": row, **row}
        try:
            text = self._template.render(context)
        except UndefinedError as exc:
            raise self._undefined(row, row_no, exc.message or str(exc)) from None
        except SecurityError as exc:
            raise RowError(row_no, None, f"{self.name} did something the sandbox forbids: "
                                         f"{exc}") from None
        except Exception as exc:  # the template's own code failed (a filter, a division)
            raise RowError(row_no, None, f"{self.name} failed: {exc.__class__.__name__}: "
                                         f"{exc}") from None
        if not text.strip():
            raise RowError(row_no, None, f"{self.name} made an empty prompt")
        return text

    def _undefined(self, row: Mapping[str, Any], row_no: int, message: str) -> RowError:
        missing = _UNDEFINED.search(message) or _NO_ATTRIBUTE.search(message)
        if missing is None:
            return RowError(row_no, None, f"{self.name}: {message}")
        column = missing[1]
        known = ", ".join(map(repr, row)) or "none"
        return RowError(row_no, column, f"{self.name} uses {column!r}, which the row does not "
                                        f"have (its columns: {known})")
