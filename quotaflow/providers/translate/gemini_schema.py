"""A JSON Schema (OpenAI's tool parameters and json_schema response formats) as the
OpenAPI 3.0 subset Gemini's `Schema` object is (generateContent's `responseSchema` and
function declarations' `parameters`).

The subset has no `$ref`, `allOf`, `oneOf`, `not` or open `additionalProperties`, and a
nullable type is a flag rather than a type list, so a schema is rewritten keyword by
keyword and one that uses anything else fails the line naming the keyword, rather than
being sent looser than written (the model would then answer outside the schema the
line asked for). `additionalProperties: false` is dropped: Gemini only ever produces
the properties a schema declares. No `propertyOrdering` is made up: a stored line's
objects keep no key order (PostgreSQL's jsonb), so the order written is not known here;
a schema that gives one keeps it.
"""

from typing import Any

from quotaflow.errors import Untranslatable

TARGET = "Gemini generateContent"
# Keywords taken as written (Gemini's Schema fields of the same name and meaning).
_SAME = frozenset({"format", "title", "description", "minItems", "maxItems", "minProperties",
                   "maxProperties", "minLength", "maxLength", "pattern", "minimum", "maximum",
                   "default", "example", "propertyOrdering", "nullable"})
_TYPES = frozenset({"string", "number", "integer", "boolean", "array", "object", "null"})


def gemini_untranslatable(path: str, detail: str = "") -> Untranslatable:
    """The error of a field at `path` that Gemini's generateContent cannot take."""
    what = f"{path} ({detail})" if detail else path
    return Untranslatable(path, f"{what} has no {TARGET} equivalent; remove it or route this "
                                "model to an OpenAI-compatible or Anthropic deployment")


def gemini_schema(schema: Any, path: str) -> dict[str, Any]:
    """Gemini's Schema for a JSON Schema; Untranslatable names the first keyword it has
    no equivalent for."""
    if not isinstance(schema, dict):
        raise gemini_untranslatable(path, "not a JSON object")
    out: dict[str, Any] = {}
    for key, value in schema.items():
        where = f"{path}.{key}"
        if key == "type":
            _type(value, where, out)
        elif key in _SAME:
            out[key] = value
        elif key in ("enum", "const"):
            values = list(value) if key == "enum" else [value]
            if not all(isinstance(v, str) for v in values):
                raise gemini_untranslatable(where, "Gemini enums are strings")
            out["enum"] = values
        elif key == "required":
            out["required"] = list(value)
        elif key in ("properties", "items", "anyOf"):
            out[key] = _nested(key, value, where)
        elif key == "additionalProperties":
            if value is not False:
                raise gemini_untranslatable(where, "Gemini schemas are closed objects")
        elif key not in ("$schema", "strict"):
            raise gemini_untranslatable(where)
    return out


def _nested(key: str, value: Any, path: str) -> Any:
    if key == "properties":
        return {name: gemini_schema(sub, f"{path}.{name}") for name, sub in value.items()}
    if key == "items":
        return gemini_schema(value, path)
    return [gemini_schema(sub, f"{path}[{n}]") for n, sub in enumerate(value)]


def _type(value: Any, path: str, out: dict[str, Any]) -> None:
    """`type` upper-cased, as Gemini's Type enum is; ["T", "null"] as T with nullable."""
    kinds = [value] if isinstance(value, str) else list(value or ())
    if any(kind not in _TYPES for kind in kinds):
        raise gemini_untranslatable(path, repr(value))
    real = [kind for kind in kinds if kind != "null"]
    if len(real) > 1:
        raise gemini_untranslatable(path, f"{value!r}: a Gemini schema has one type; use anyOf")
    if len(real) < len(kinds):
        out["nullable"] = True
    out["type"] = (real[0] if real else "null").upper()
